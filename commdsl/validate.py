"""Static checks that compare ranks: P2P matching and collective sequences.

Run at load time on the expanded Program. Each failure names both ranks and both
source lines. One pass over the ops sorts out what each check needs (the sends and
recvs of each channel, each group's collectives per rank, the peer copies); the checks
then take time linear in what they are given, and compare two ranks' collectives by
their shared `OpSpec` first, field by field only where the specs differ. Whether a well-matched schedule can still deadlock (ordering across
groups, blocking sends head to head) is decided by the simulator's progress check.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from commdsl.dsl.values import format_bytes
from commdsl.errors import ValidationError
from commdsl.ir import COLLECTIVE_KINDS, CopyDir, Op, OpKind, Program

_Channel = tuple[int, int, str]
"""(source rank, destination rank, group id)."""


@dataclass
class _Sorted:
    """The ops each check looks at, gathered in one pass over the program."""

    sends: dict[_Channel, list[Op]] = field(default_factory=lambda: defaultdict(list))
    recvs: dict[_Channel, list[Op]] = field(default_factory=lambda: defaultdict(list))
    collectives: dict[str, dict[int, list[Op]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    """Per group id, per rank, its collectives in issue order."""
    peer_copies: list[Op] = field(default_factory=list)


def _sort(program: Program) -> _Sorted:
    out = _Sorted()
    sends, recvs, collectives, copies = out.sends, out.recvs, out.collectives, out.peer_copies
    send, recv, copy, peer = OpKind.SEND, OpKind.RECV, OpKind.COPY, CopyDir.PEER
    for rank_ops in program.ops:
        for op in rank_ops:
            kind = op.kind
            if kind is send:
                spec = op.spec
                sends[(op.rank, spec.peer, spec.group)].append(op)
            elif kind is recv:
                spec = op.spec
                recvs[(spec.peer, op.rank, spec.group)].append(op)
            elif kind in COLLECTIVE_KINDS:
                collectives[op.spec.group][op.rank].append(op)
            elif kind is copy and op.spec.copy_dir is peer:
                copies.append(op)
    return out


def validate_program(program: Program) -> None:
    ops = _sort(program)
    check_p2p_matching(ops.sends, ops.recvs)
    check_collective_sequences(program, ops.collectives)
    check_peer_copies(ops.peer_copies)


def _describe(op: Op) -> str:
    return f"{op.label} ({format_bytes(op.size_bytes)}) on rank {op.rank}"


def check_p2p_matching(sends: dict[_Channel, list[Op]], recvs: dict[_Channel, list[Op]]) -> None:
    """Sends and recvs match first-in-first-out per (src, dst, group), with equal sizes."""
    for channel in sorted(set(sends) | set(recvs)):
        src, dst, group = channel
        s_list, r_list = sends.get(channel, []), recvs.get(channel, [])
        for i, (s, r) in enumerate(zip(s_list, r_list)):
            s_spec, r_spec = s.spec, r.spec
            if s_spec.size_bytes == r_spec.size_bytes and s_spec.transport is r_spec.transport:
                continue  # the usual case; below, what differs
            if s.size_bytes != r.size_bytes:
                raise ValidationError(
                    f"send #{i + 1} from rank {src} to rank {dst} on group {group} is {format_bytes(s.size_bytes)} "
                    f"but the matching recv is {format_bytes(r.size_bytes)}",
                    s.loc,
                    rank=src,
                    related=(("the recv (rank %d)" % dst, r.loc),),
                    hint="sends and recvs between two ranks match in program order",
                )
            if s.transport is not r.transport:
                raise ValidationError(
                    f"send #{i + 1} from rank {src} to rank {dst} uses transport {s.transport.value} "
                    f"but the matching recv uses {r.transport.value}",
                    s.loc,
                    rank=src,
                    related=(("the recv (rank %d)" % dst, r.loc),),
                )
        if len(s_list) != len(r_list):
            more, fewer = ("send", "recv") if len(s_list) > len(r_list) else ("recv", "send")
            longer, shorter = (s_list, r_list) if len(s_list) > len(r_list) else (r_list, s_list)
            extra = longer[len(shorter)]
            related = ()
            if shorter:
                last = shorter[-1]
                related = ((f"the last {fewer} it could match, on rank {last.rank}", last.loc),)
            hint = f"add the missing {fewer} on rank {dst if more == 'send' else src}, or remove this {more}"
            other_groups = sorted({c[2] for c in (recvs if more == "send" else sends) if c[:2] == (src, dst) and c[2] != group})
            if other_groups:
                who = f"rank {dst} receives" if more == "send" else f"rank {src} sends"
                hint = (f"{who} on group {', '.join(other_groups)} instead: "
                        "a send and its recv must name the same group")  # fmt: skip
            raise ValidationError(
                f"rank {src} sends {len(s_list)} message(s) to rank {dst} on group {group} but rank {dst} "
                f"receives {len(r_list)}; the first unmatched {more} is {_describe(extra)}",
                extra.loc,
                rank=extra.rank,
                related=related,
                hint=hint,
            )


def check_peer_copies(peer_copies: list[Op]) -> None:
    """Copies into one buffer of a rank (`copy x SIZE to RANK into NAME`, from any rank)
    agree on its size and dtype: the destination holds one buffer per name."""
    first: dict[tuple[int, str], Op] = {}
    for op in peer_copies:
        key = (op.peer, op.dest)
        seen = first.setdefault(key, op)
        if (seen.size_bytes, seen.dtype) != (op.size_bytes, op.dtype):
            raise ValidationError(
                f"rank {op.rank} copies {format_bytes(op.size_bytes)} of {op.dtype.value} into {op.dest} on rank {op.peer}, "
                f"but rank {seen.rank} copies {format_bytes(seen.size_bytes)} of {seen.dtype.value} into the same buffer",
                op.loc,
                rank=op.rank,
                related=((f"the first copy into {op.dest} (rank {seen.rank})", seen.loc),),
                hint="a rank holds one buffer per name: copy the same size and dtype into it, or name another with `into NAME`",
            )


def _signature(op: Op) -> tuple:
    # algo= and proto= too: NCCL's ranks must agree on them (a mismatch hangs or corrupts
    # data), and a simulation would take one rank's choice for all.
    return (op.kind, op.size_bytes, op.root, op.reduce_op, op.dtype, op.algo, op.proto)


_SIGNATURE_FIELDS = ("kind", "size", "root", "reduce op", "dtype", "algo", "proto")


def _differences(a: Op, b: Op) -> str:
    if a.kind is not b.kind:
        return "kind"
    fields = [name for name, x, y in zip(_SIGNATURE_FIELDS, _signature(a), _signature(b)) if x != y]
    return " and ".join(fields)


def _sig_text(op: Op) -> str:
    parts = [op.label]
    if op.kind is not OpKind.BARRIER:
        parts.append(format_bytes(op.size_bytes))
        parts.append(op.dtype.value)
    if op.root is not None:
        parts.append(f"root={op.root}")
    if op.reduce_op is not None:
        parts.append(f"op={op.reduce_op.value}")
    parts += [f"{key}={value.value}" for key, value in (("algo", op.algo), ("proto", op.proto)) if value is not None]
    return " ".join(parts)


def _same_sequence(ref: list[Op], seq: list[Op]) -> bool:
    """Whether two ranks' collectives on a group agree (kind, size, root, op, dtype, algo,
    proto); ops that share a spec (most do) agree without comparing fields."""
    if len(ref) != len(seq):
        return False
    for a, b in zip(ref, seq):
        if a.kind is not b.kind or (a.spec is not b.spec and _signature(a) != _signature(b)):
            return False
    return True


def check_collective_sequences(program: Program, per_group: dict[str, dict[int, list[Op]]]) -> None:
    """Every member of a group issues the same collectives (kind, size, root, op, dtype,
    algo, proto) in order."""
    for group_id, by_rank in per_group.items():
        group = program.group(group_id)
        ref_rank = min(by_rank)
        ref = by_rank[ref_rank]
        # Of a folded program, the members that issue ops: the other replicas' run the same
        # ops renamed (verified by the expansion), so the group is whole by construction.
        members = group.ranks if program.fold is None else program.fold.present(group.ranks)
        for rank in members:
            seq = by_rank.get(rank, [])
            if _same_sequence(ref, seq):
                continue  # the usual case; the loops below say what differs
            for i, (a, b) in enumerate(zip(ref, seq)):
                if _signature(a) != _signature(b):
                    raise ValidationError(
                        f"collective #{i + 1} on group {group_id} differs between ranks ({_differences(a, b)}): "
                        f"rank {ref_rank} issues `{_sig_text(a)}` but rank {rank} issues `{_sig_text(b)}`",
                        b.loc,
                        rank=rank,
                        related=((f"rank {ref_rank}'s collective", a.loc),),
                        hint="NCCL matches collectives by order per communicator; a mismatch hangs or corrupts data",
                    )
            if len(seq) != len(ref):
                longer, shorter = (ref_rank, rank) if len(ref) > len(seq) else (rank, ref_rank)
                longer_seq, shorter_seq = by_rank[longer], by_rank.get(shorter, [])
                extra = longer_seq[len(shorter_seq)]
                related = ()
                if shorter_seq:
                    related = ((f"rank {shorter}'s last collective on {group_id}", shorter_seq[-1].loc),)
                raise ValidationError(
                    f"rank {longer} issues {len(longer_seq)} collective(s) on group {group_id} but rank {shorter} "
                    f"issues {len(shorter_seq)}; the first without a partner is `{_sig_text(extra)}`",
                    extra.loc,
                    rank=longer,
                    related=related,
                    hint=f"every member of {group_id} (ranks {list(group.ranks)}) must issue each collective",
                )
