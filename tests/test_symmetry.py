"""Folding interchangeable ranks (`commdsl.sim.symmetry`): the engine runs rank 0 alone
where every rank runs the same ops, and must give what a run of every rank gives, op for
op and flow for flow; anything that tells ranks apart must turn folding off."""

from __future__ import annotations

import importlib
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.loader import PRESETS_DIR
from commdsl.sim import simulate
from commdsl.sim.chains import ChainRuns
from commdsl.sim.engine import Engine
from commdsl.sim.simulate import NETWORKS
from commdsl.sim.wiring import wire

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"
MACHINES = ("h100-nvlink", "dgx-h100", "cpu-loopback", "pcie-nvlink-pairs")


def outcome(program, machine, network: str, fold: bool):
    """Everything a run leaves behind: the per-op arrays, slowed compute, flows and links."""
    engine = Engine(program, machine, NETWORKS[network], fold=fold)
    raw = engine.run()
    makespan = max(raw.end, default=0.0)
    arrays = {name: getattr(raw, name).tobytes() if name != "state" else bytes(raw.state)
              for name in ("issue_start", "issue_end", "start", "end", "state", "cause")}  # fmt: skip
    return engine.folded, arrays, engine.nominal_us, engine.network.flow_stats(), engine.network.link_stats(makespan)


def wiring_facts(program, machine, network: str, symmetric: bool) -> dict:
    """`wire()`'s result as plain values: every per-op array, queue and collective instance."""
    engine = Engine(program, machine, NETWORKS[network], fold=False)
    w = wire(program, engine.ops, engine.base, machine, engine.network, symmetric)
    facts = {name: bytes(getattr(w, name)) for name in ("queue_at", "partner", "coll_at", "batch_last", "algos", "protos", "kinds", "on_stream")}
    facts["queues"] = [{group: (q.rank, q.number, q.fifo.typecode) for group, q in rank_queues.items()} for rank_queues in w.queues]
    facts["queue_list"] = [(q.rank, q.group, q.number) for q in w.queue_list]
    facts["collectives"] = [(c.group, c.seq, c.size, c.number, list(c.ops)) for c in w.collectives]
    facts["batch_multi"] = w.batch_multi
    facts["batch_gloo"] = w.batch_gloo
    return facts


def assert_fold_changes_nothing(program, machine, network: str) -> None:
    folded, *result = outcome(program, machine, network, fold=True)
    unfolded, *reference = outcome(program, machine, network, fold=False)
    # NCCL broadcast / reduce with NCCL's model are chains whose ranks end apart: never folded
    assert folded is not ChainRuns.in_ops(program.ops[0], machine) and not unfolded
    for got, want in zip(result, reference):
        assert got == want
    # The wiring derived from rank 0 is the one a walk over every rank makes.
    assert wiring_facts(program, machine, network, True) == wiring_facts(program, machine, network, False)


def schedule(body: str, world: int):
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: [s, t]\nprogram: |\n{program}\n", "t.yaml", validate=False)


@pytest.mark.parametrize("name", ["ddp_overlap", "fsdp"])
@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_bundled_spmd_schedules_fold_and_match_a_run_of_every_rank(name, machine, network):
    assert_fold_changes_nothing(load_schedule(name), resolve_machine(machine), network)


@pytest.mark.parametrize("network", ["flow", "analytic", "flow-steps"])
def test_data_parallelism_across_nodes_folds_and_matches(network):
    # 16 ranks on two 8-GPU nodes: collectives cross the network between nodes.
    assert_fold_changes_nothing(load_schedule("ddp_overlap", {"ranks": "16"}), resolve_machine("dgx-h100").with_nodes(2), network)


def test_bundled_schedules_that_tell_ranks_apart_do_not_fold():
    folding = set()
    for path in sorted(SCHEDULES.glob("*.yaml")):
        program = load_schedule(path.stem)
        if Engine(program, resolve_machine("h100-nvlink"), NETWORKS["flow"]).folded:
            folding.add(path.stem)
    # Pipelines send to their neighbours; collectives.yaml and tp_mlp use subgroups or roots per rank.
    assert folding == {"ddp_overlap", "fsdp"}


# Symmetric programs made from random statements: every one must fold, and match.
STATEMENT = st.one_of(
    st.tuples(st.just("compute"), st.sampled_from(["s", "t"]), st.integers(1, 900)),
    st.tuples(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]), st.sampled_from(["s", "t"]),
              st.integers(1, 5000)),  # fmt: skip
    st.tuples(st.just("async"), st.sampled_from(["s", "t"]), st.integers(1, 5000)),
    st.tuples(st.just("event"), st.sampled_from(["s", "t"]), st.just(0)),
    st.tuples(st.just("sync"), st.just(""), st.just(0)),
)


def spmd_body(statements) -> str:
    lines, handles = [], []
    for i, (what, stream, n) in enumerate(statements):
        other = "t" if stream == "s" else "s"
        if what == "compute":
            lines.append(f"compute C{i} {n}us on {stream}")
        elif what == "async":
            lines.append(f"h{i} = all_reduce a{i} {12 * n}KiB on {stream}")
            handles.append(f"h{i}")
        elif what == "event":
            lines += [f"record e{i} on {stream}", f"wait e{i} on {other}"]
        elif what == "sync":
            lines.append("synchronize")
        else:
            root = {"broadcast": " src=1", "reduce": " dst=0"}.get(what, "")
            lines.append(f"{what} x{i} {12 * n}KiB{root} on {stream}")  # splits among 2, 3 or 4 ranks
    lines += [f"wait {h} on s" for h in handles]
    return "\n".join(lines)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(statements=st.lists(STATEMENT, min_size=1, max_size=12), world=st.integers(2, 4),
       machine=st.sampled_from(MACHINES), network=st.sampled_from(["flow", "analytic", "flow-steps"]))  # fmt: skip
def test_random_spmd_programs_fold_and_match(statements, world, machine, network):
    assert_fold_changes_nothing(schedule(spmd_body(statements), world), resolve_machine(machine), network)


NOT_INTERCHANGEABLE = {
    "a send to the next rank": "send x 1MiB to (rank + 1) % world_size\nrecv y 1MiB from (rank - 1) % world_size",
    "a rank with more ops": "compute F 1ms\nif rank == 0:\n    compute G 1ms",
    "a duration per rank": "compute F (rank + 1) * 1ms",
    "a size per rank": "all_reduce x (rank + 1) * 1MiB",
    "a subgroup": "all_reduce x 1MiB group=pair",
}


@pytest.mark.parametrize("case", NOT_INTERCHANGEABLE)
def test_programs_that_tell_ranks_apart_do_not_fold(case):
    extra = "groups:\n  pair: [[0, 1], [2, 3]]\n" if "group=pair" in NOT_INTERCHANGEABLE[case] else ""
    body = "\n".join("  " + line for line in NOT_INTERCHANGEABLE[case].splitlines())
    program = load_schedule_text(f"name: t\nworld: 4\nstreams: [s]\n{extra}program: |\n{body}\n", "t.yaml", validate=False)
    assert not Engine(program, resolve_machine("h100-nvlink"), NETWORKS["flow"]).folded


def test_names_per_rank_still_fold():
    program = schedule("compute F[rank] 1ms on s\nall_reduce x[rank] 1MiB on t", 4)
    assert_fold_changes_nothing(program, resolve_machine("h100-nvlink"), "flow")


def test_machines_that_couple_ranks_do_not_fold():
    program = load_schedule("ddp_overlap")
    cpu_text = (PRESETS_DIR / "cpu-loopback.yaml").read_text()
    assert Engine(program, load_machine_text(cpu_text, "cpu.yaml"), NETWORKS["flow"]).folded
    # Each rank draws its own noise in a sampled run.
    noisy = load_machine_text(cpu_text + "compute_noise: {stalls_per_s: 200, stall_us: 300}\n", "noisy.yaml")
    assert not Engine(program, noisy, NETWORKS["flow"], random.Random(0)).folded
    # Compute that slows transfers: the network hears which ranks compute.
    slowed = load_machine_text(cpu_text + "compute_comm_slowdown: 2.0\n", "slowed.yaml")
    assert not Engine(program, slowed, NETWORKS["flow"]).folded


def test_a_folded_run_that_cannot_finish_is_run_again_with_every_rank(monkeypatch):
    # Symmetric ranks match every collective, so a folded run that stops short is not
    # expected; should one, `simulate` runs every rank, as it would to report a deadlock.
    program, machine = load_schedule("ddp_overlap"), resolve_machine("h100-nvlink")
    want = simulate(program, machine).raw.end

    class RankZeroNeverFinishes(Engine):  # a subclass: the compiled Engine's methods cannot be patched
        def _transfer_done_folded(self, transfer, members):
            pass

    monkeypatch.setattr(importlib.import_module("commdsl.sim.simulate"), "Engine", RankZeroNeverFinishes)
    assert simulate(program, machine).raw.end == want
