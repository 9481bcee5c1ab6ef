"""Load a schedule file: YAML -> params -> world, groups -> compiled program -> Program.

YAML is read with the safe loader only. We also compose the node tree (no objects are
constructed from it) to know where every value sits in the file, so errors inside the
`program:` block or a param value point at the file's real line and column.
"""

from __future__ import annotations

import gc
import itertools
import math
import re
from pathlib import Path

import yaml

from commdsl.dsl.compile import ProgramCompiler
from commdsl.dsl.expand import ExpansionBudget, InternTables, RankExpander, StageTransfers, WorldLayout
from commdsl.dsl.fold import FoldGroups, fold_axis, make_fold, replica_difference, representative_problem
from commdsl.dsl.spmd import RankTemplate
from commdsl.dsl.lower import lower_stage_transfers
from commdsl.dsl.parser import TextOrigin, is_name, parse_expression, parse_program
from commdsl.dsl.values import INT_LIMIT, QUANTITY_LITERAL, ValueFault, format_value, parse_quantity
from commdsl.errors import LimitError, ScheduleError, UsageError, did_you_mean
from commdsl.files import is_file, read_text
from commdsl.ir import Dtype, Fold, Group, Program, Transport
from commdsl.limits import DEFAULT_MAX_OPS, MAX_WORLD_SIZE
from commdsl.resources import bundled_schedules, resolve_schedule
from commdsl.yamldoc import YamlDocument

_STR_TAG = "tag:yaml.org,2002:str"
_BLOCK_HEADER = re.compile(r"[|>]([1-9]?)[+-]?([1-9]?)")
_TOP_LEVEL_KEYS = ("name", "doc", "params", "world", "streams", "groups", "transport", "dtype", "program")


class _YamlFile(YamlDocument):
    """The schedule's node tree with the schedule's own helpers."""

    def __init__(self, text: str, file: str):
        super().__init__(text, file, ScheduleError)

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Keys of a mapping node with (key node, value node); rejects duplicates."""
        if not isinstance(node, yaml.MappingNode):
            raise ScheduleError(f"{what} must be a mapping (key: value lines)", self.loc(node))
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if not isinstance(key, str) or not is_name(key):
                raise ScheduleError(f"{what}: keys must be names (letters, digits and _, not starting with a digit), got "
                                    f"{self.scalar_text(k)}", self.loc(k))  # fmt: skip
            if key in out:
                raise ScheduleError(f"{what}: key '{key}' appears twice (first at line {out[key][0].start_mark.line + 1})", self.loc(k))
            out[key] = (k, v)
        return out

    def origin_of_scalar(self, node: yaml.ScalarNode) -> TextOrigin:
        """Where the text of a scalar starts, for mapping expression/program positions."""
        mark = node.start_mark
        if node.style in ("|", ">"):
            first = mark.line + 2  # content starts on the line after the indicator
            header = self.lines[mark.line][mark.column :] if mark.line < len(self.lines) else ""
            explicit = _BLOCK_HEADER.match(header)
            digits = explicit.group(1) or explicit.group(2) if explicit else ""
            indent = int(digits) if digits else 0
            if not digits:  # YAML takes the indentation of the first non-blank line
                for line in self.lines[first - 1 :]:
                    if line.strip():
                        indent = len(line) - len(line.lstrip(" "))
                        break
            return TextOrigin(self.file, self.lines, first, indent, block=True)
        quote = 1 if node.style in ("'", '"') else 0
        end = node.end_mark
        # Positions map exactly only when the text is written on one line as it is.
        exact = end.line == mark.line and len(node.value) == end.column - mark.column - 2 * quote
        return TextOrigin(self.file, self.lines, mark.line + 1, mark.column + quote, block=False, exact=exact)


def load_schedule(
    arg: str,
    overrides: dict[str, str] | None = None,
    *,
    max_ops: int = DEFAULT_MAX_OPS,
    validate: bool = True,
    fold: bool = False,
    fold_unit: int = 1,
    overrides_from: str = "-p",
) -> Program:
    """Load a schedule by path or bundled name; `overrides` are `-p key=value` pairs
    (`overrides_from`: what messages call them, "-p" or a Python function's name).
    `fold`: where the replicas along a mesh axis verifiably run the same program, expand
    one of them and describe the others by `Program.fold` (`commdsl.dsl.fold`; only for
    consumers that understand a `Fold`: the checks and the simulator). `fold_unit`: the
    GPUs of a node of the machine it will run on; where one replica's ranks are not a
    whole number of them, the fewest consecutive replicas that are stand for the rest."""
    path = resolve_schedule(arg)
    if path is None:
        raise UsageError(
            f"no such schedule file or bundled schedule: {arg}",
            hint="bundled schedules: " + ", ".join(bundled_schedules()),
        )
    # A bundled schedule is named the same in every checkout and install, so traces and
    # messages do not depend on where commdsl lives.
    display = arg if is_file(arg) else f"schedules/{path.name}"
    text = read_text(path, display, ScheduleError, "schedule")
    return load_schedule_text(text, display, overrides, max_ops=max_ops, validate=validate, fold=fold, fold_unit=fold_unit,
                              overrides_from=overrides_from)  # fmt: skip


def parse_overrides(items: list[str]) -> dict[str, str]:
    """`-p KEY=VALUE` options (in command-line order) as `load_schedule`'s overrides;
    a malformed or repeated one is a usage error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not is_name(key) or not value:
            raise UsageError(f"-p takes KEY=VALUE with KEY a param's name, got '{item}'", hint="e.g. -p stages=8 or -p act=64MiB")
        if key in out:
            raise UsageError(f"-p {key} is given twice")
        out[key] = value
    return out


def load_schedule_text(
    text: str,
    file: str = "<schedule>",
    overrides: dict[str, str] | None = None,
    *,
    max_ops: int = DEFAULT_MAX_OPS,
    validate: bool = True,
    fold: bool = False,
    fold_unit: int = 1,
    overrides_from: str = "-p",
) -> Program:
    """Load a schedule from its text; `file` is the name used in messages; `fold`,
    `fold_unit` and `overrides_from` as in `load_schedule`."""
    if not isinstance(fold_unit, int) or fold_unit < 1:
        raise UsageError(f"fold_unit is the GPUs of a node, a whole number of at least 1, got {fold_unit!r}")
    doc, top = _schedule_top(text, file)
    name = _string(doc, top, "name", Path(file).stem)
    docstring = _string(doc, top, "doc", "")
    params = _params(doc, top.get("params"), overrides or {}, overrides_from)
    env = dict(params)
    try:
        layout = _layout(doc, top, env)
    except ScheduleError as err:  # a world or mesh made of params: say which values were given
        if overrides and err.hint is None:
            given = ", ".join(f"-p {k}={v}" if overrides_from == "-p" else f"{k}={v}" for k, v in overrides.items())
            err.hint = f"the params given: {given}"
        raise

    prog_node = top["program"][1]
    if not isinstance(prog_node, yaml.ScalarNode) or prog_node.tag != _STR_TAG:
        raise ScheduleError("`program:` must be a text block", doc.loc(prog_node),
                            hint="write `program: |` and the ops on the following, indented lines")  # fmt: skip
    if prog_node.style == ">":
        raise ScheduleError("`program: >` folds the program's lines together", doc.loc(prog_node),
                            hint="write `program: |` (a literal block) instead")  # fmt: skip
    if prog_node.style != "|" and prog_node.end_mark.line > prog_node.start_mark.line:
        # YAML joins a plain or quoted scalar's lines with spaces: the ops would run together.
        what = "plain text" if not prog_node.style else "a quoted string"
        raise ScheduleError(f"`program:` written as {what} over several lines: YAML joins its lines into one", doc.loc(prog_node),
                            hint="write `program: |` and the ops on the following, indented lines")  # fmt: skip
    origin = doc.origin_of_scalar(prog_node)
    tree = parse_program(prog_node.value, origin, tuple(params))
    compiler = ProgramCompiler(origin, layout, tuple(params))
    compiled = compiler.compile(tree, params)
    # Expansion makes millions of objects and next to no reference cycles: the cyclic
    # collector would only walk them again and again as they are made, so it rests.
    collecting = gc.isenabled()
    gc.disable()
    try:
        rank_reads = compiler.rank_reads if fold else None
        return _expand(name, docstring, file, params, layout, origin, compiled, compiler.reads_rank, compiler.names,
                       max_ops=max_ops, validate=validate, rank_reads=rank_reads, fold_unit=fold_unit)  # fmt: skip
    finally:
        if collecting:
            gc.enable()


def _expand(name: str, docstring: str, file: str, params: dict[str, object], layout: WorldLayout, origin: TextOrigin,
            compiled, reads_rank: bool, names: dict[str, str], *, max_ops: int, validate: bool,
            rank_reads: set[tuple[str, ...]] | None = None, fold_unit: int = 1) -> Program:  # fmt: skip
    """Run the compiled program for every rank (or, if it never reads its rank, for rank 0,
    then copy: commdsl/dsl/spmd.py), place the stage transfers, validate. With
    `rank_reads` (what the program reads of its rank), fold the replicas along a mesh
    axis where that is verified (commdsl/dsl/fold.py; `fold_unit` as `load_schedule`'s)."""
    budget = ExpansionBudget(max_ops=max_ops, max_steps=max(4 * max_ops, 1_000_000))
    tables = InternTables(names)

    def expand_rank(rank: int, rank_at_uses: list | None = None) -> RankExpander:
        """Run the program for `rank`: its expander, finished (`RankExpander.rank_at_uses`:
        as given)."""
        expander = RankExpander(rank, layout, budget, tables, rank_at_uses=rank_at_uses)
        env = dict(params)
        env["rank"] = rank
        env["world_size"] = layout.world_size
        env["__ctx__"] = expander
        expander.globals = env
        try:
            compiled(expander, env)
        except RecursionError:
            raise LimitError("the program nests too deeply (expressions or block calls)", origin.loc(1, 1),
                             rank=rank) from None  # fmt: skip
        expander.finish()
        del env["__ctx__"]  # env and expander refer to each other: free them now, not at the next collection
        return expander

    def program_of(per_rank, warnings, fold: Fold | None = None, fold_note: str = "") -> Program:
        program = Program(
            name=name,
            doc=docstring,
            source=file,
            params=tuple((k, format_value(v)) for k, v in params.items()),
            world_size=layout.world_size,
            mesh=layout.mesh,
            streams=layout.streams,
            groups=tuple(g for groups in layout.families.values() for g in groups),
            ops=tuple(per_rank),
            warnings=tuple(warnings),
            fold=fold,
            fold_note=fold_note,
        )
        if validate:
            from commdsl.validate import validate_program

            validate_program(program)
        return program

    fold_note = ""
    if rank_reads is not None:
        folded = _expand_folded(layout, rank_reads, expand_rank, fold_unit)
        if not isinstance(folded, str):
            per_rank, fold, fold_note = folded
            return program_of(per_rank, (), fold, fold_note)
        fold_note = folded
        budget.ops = budget.steps = 0  # the full expansion below starts over
    per_rank = []
    transfers = []
    warnings: list[str] = []
    template: RankTemplate | None = None
    for rank in range(layout.world_size):
        if template is not None and (ops := template.copy_for(rank, budget)) is not None:
            per_rank.append(ops)
            transfers.append(StageTransfers((), ()))
            continue
        steps_before = budget.steps
        expander = expand_rank(rank)
        per_rank.append(tuple(expander.ops))
        transfers.append(expander.stage_transfers())
        warnings.extend(expander.warnings)
        if rank == 0 and not reads_rank:
            template = RankTemplate.of(expander, budget.steps - steps_before)
    per_rank = lower_stage_transfers(per_rank, transfers)
    return program_of(per_rank, warnings, fold_note=fold_note)


def _expand_folded(layout: WorldLayout, rank_reads: set[tuple[str, ...]], expand_rank,
                   unit: int = 1) -> tuple[list, Fold, str] | str:  # fmt: skip
    """The folded expansion (commdsl/dsl/fold.py): (the ops per rank, empty but for the
    representative's ranks; the `Fold`; a line that says so), or why it cannot be folded
    ("" where there is nothing to fold). `expand_rank(rank)` runs the program for a rank;
    `unit` as `make_fold`'s."""
    axis, why = fold_axis(layout, rank_reads)
    if axis is None:
        return f"not folded: {why}" if why else ""
    fold = make_fold(layout, axis, unit)
    if fold.replicas < 2:
        return (f"not folded along {axis}: its {fold.block} replicas fill whole {unit}-rank nodes only all together "
                f"(one replica is {fold.stride // fold.block} rank{'s' if fold.stride // fold.block != 1 else ''})")  # fmt: skip
    checked = sorted({1, fold.replicas - 1})  # the next replica and the last one
    empty = StageTransfers((), ())
    per_rank: list[tuple] = [()] * layout.world_size
    transfers = [empty] * layout.world_size
    uses: list = []  # rank_at() values of the representative used as numbers (commdsl/dsl/replica_rank.py)
    for replica in (0, *checked):
        for rank in fold.ranks:
            expander = expand_rank(rank + replica * fold.stride, uses if replica == 0 else None)
            if uses:
                return (f"not folded along {axis}: a value of rank_at() ({uses[0]}) is used as a number, not only as a "
                        f"peer or a root (replicas could differ in what it decides)")  # fmt: skip
            if expander.warnings:
                return f"not folded along {axis}: rank {expander.rank} warns ({expander.warnings[0]})"
            per_rank[expander.rank] = tuple(expander.ops)
            transfers[expander.rank] = expander.stage_transfers()
    per_rank = lower_stage_transfers(per_rank, transfers)
    groups = FoldGroups(layout, fold)
    why = representative_problem(per_rank, fold, groups)
    for replica in checked:
        why = why or replica_difference(per_rank, fold, groups, replica)
    if why:
        return f"not folded along {axis}: {why}"
    for replica in checked:
        for rank in fold.ranks:
            per_rank[rank + replica * fold.stride] = ()
    ranks = f"the {len(fold.ranks):,} ranks" if len(fold.ranks) > 1 else "the rank"
    b = fold.block
    at_a_time = "" if b == 1 else f", {b} at a time, a whole number of nodes"
    expanded = " and ".join(f"{axis} = {k * b}" + ("" if b == 1 else f"..{k * b + b - 1}") for k in checked)
    note = (f"folded along {axis}: {ranks} with {fold.label} run for all {fold.replicas * b} replicas{at_a_time} "
            f"({expanded} expanded too, and found the same renamed)")  # fmt: skip
    return per_rank, fold, note


def _schedule_top(text: str, file: str) -> tuple[_YamlFile, dict[str, tuple[yaml.Node, yaml.Node]]]:
    """A schedule's YAML and its top-level keys, checked to be a schedule's (known keys, a
    `program:`); what the keys hold is read later."""
    doc = _YamlFile(text, file)
    if doc.root is None:
        raise ScheduleError("the schedule file is empty", doc.file_start(),
                            hint="a schedule needs at least `world:` and `program:`")  # fmt: skip
    top = doc.mapping(doc.root, "the schedule")
    for key, (knode, _) in top.items():
        if key not in _TOP_LEVEL_KEYS:
            raise ScheduleError(f"unknown top-level key '{key}' (known: {', '.join(_TOP_LEVEL_KEYS)})", doc.loc(knode),
                                hint=did_you_mean(key, _TOP_LEVEL_KEYS))  # fmt: skip
    if "program" not in top:
        raise ScheduleError("the schedule has no `program:` block", doc.loc(doc.root))
    return doc, top


def declared_params(text: str, file: str) -> list[str]:
    """The names of the params a schedule's text declares, its top level checked as
    `load_schedule_text` checks it (a `ScheduleError` where it is no schedule)."""
    doc, top = _schedule_top(text, file)
    return list(doc.mapping(top["params"][1], "params")) if "params" in top else []


def _string(doc: _YamlFile, top, key: str, default: str) -> str:
    if key not in top:
        return default
    node = top[key][1]
    if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:null":
        raise ScheduleError(f"`{key}` must be text", doc.loc(node))
    return str(node.value).strip()


def _eval_text(text: str, origin: TextOrigin, env: dict) -> object:
    """Evaluate a one-expression text (param value, world size, a group rank)."""
    if QUANTITY_LITERAL.fullmatch(text):  # the usual param, 32MiB or 2ms: no parser needed
        try:
            return parse_quantity(text)
        except ValueFault as e:
            raise ScheduleError(str(e), origin.loc(1, 1)) from None
    tree = parse_expression(text, origin)
    layout = WorldLayout(1, (), ("compute",), {}, Transport.NCCL, Dtype.FP32)
    expr = ProgramCompiler(origin, layout, tuple(env)).compile(tree)
    return expr(env)


def _scalar_value(doc: _YamlFile, node: yaml.Node, env: dict, what: str) -> object:
    """A YAML scalar: ints, floats and booleans as they are; strings as expressions."""
    if not isinstance(node, yaml.ScalarNode):
        raise ScheduleError(f"{what} must be a single value", doc.loc(node))
    # Plain scalars resolve as YAML would (int, float, bool); quoted ones stay text.
    value = node.value if node.tag == _STR_TAG else doc.construct(node)
    if isinstance(value, float) and not math.isfinite(value):
        raise ScheduleError(f"{what} must be a finite number, got {doc.scalar_text(node)}", doc.loc(node))
    if isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT < value < INT_LIMIT:
        raise ScheduleError(f"{what} is too large: {doc.scalar_text(node)} (the limit is 2**63)", doc.loc(node))
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return _eval_text(value, doc.origin_of_scalar(node), env)
    raise ScheduleError(f"{what} must be a number, a boolean or an expression such as 32MiB", doc.loc(node))


def _override_label(key: str, source: str) -> str:
    """How a message names an override: `-p act` on the command line, `load(act=...)` in Python."""
    return f"-p {key}" if source == "-p" else f"{source}({key}=...)"


def _params(doc: _YamlFile, entry, overrides: dict[str, str], source: str = "-p") -> dict[str, object]:
    if entry is None:
        nodes: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    else:
        nodes = doc.mapping(entry[1], "params")
    unknown = [k for k in overrides if k not in nodes]
    if unknown:
        raise UsageError(
            f"{_override_label(unknown[0], source) + ('=...' if source == '-p' else '')}: the schedule has no param '{unknown[0]}'"
            + (f" (params: {', '.join(nodes)})" if nodes else " (it declares none)"),
            hint=did_you_mean(unknown[0], nodes),
        )
    env: dict[str, object] = {}
    for key, (knode, vnode) in nodes.items():
        if key in ("rank", "world_size", "world") or key.startswith("__"):
            raise ScheduleError(f"'{key}' is reserved and cannot be a param", doc.loc(knode))
        if key in overrides:
            text = overrides[key]
            origin = TextOrigin(_override_label(key, source), (text,), 1, 0, block=False)
            env[key] = _eval_text(text, origin, env)
        else:
            env[key] = _scalar_value(doc, vnode, env, f"param '{key}'")
    return env


def _int_value(doc, node, env, what: str, minimum: int) -> int:
    v = _scalar_value(doc, node, env, what)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        shown = repr(v) if isinstance(v, float) else format_value(v)  # 2.0, not the 2 a number prints as
        raise ScheduleError(f"{what} must be an integer >= {minimum}, got {shown}", doc.loc(node),
                            hint=f"write {int(v)}" if isinstance(v, float) and v.is_integer() and v >= minimum else None)  # fmt: skip
    return v


def _layout(doc: _YamlFile, top, env: dict) -> WorldLayout:
    if "world" not in top:
        raise ScheduleError("the schedule has no `world:` (a rank count, or a mesh such as {pp: 4, dp: 2})", doc.loc(doc.root))
    wnode = top["world"][1]
    mesh: tuple[tuple[str, int], ...]
    if isinstance(wnode, yaml.MappingNode):
        axes = doc.mapping(wnode, "world")
        if not axes:
            raise ScheduleError("`world: {}` names no mesh axis: give a rank count or a mesh such as {pp: 4, dp: 2}",
                                doc.loc(wnode), hint="e.g. world: 4, or world: {pp: 4}")  # fmt: skip
        mesh = tuple((axis, _int_value(doc, v, env, f"mesh axis '{axis}'", 1)) for axis, (_, v) in axes.items())
        for axis, (knode, _) in axes.items():
            if axis in ("world", "host"):
                raise ScheduleError(f"'{axis}' is reserved and cannot be a mesh axis", doc.loc(knode))
    else:
        mesh = ()
        size = _int_value(doc, wnode, env, "world", 1)
    world_size = 1
    for _, n in mesh:
        world_size *= n
    if not mesh:
        world_size = size
    if world_size > MAX_WORLD_SIZE:
        raise LimitError(f"world of {world_size:,} ranks exceeds the limit of {MAX_WORLD_SIZE:,}", doc.loc(wnode))

    streams = _streams(doc, top)
    families: dict[str, tuple[Group, ...]] = {"world": (Group("world", "world", tuple(range(world_size))),)}
    for axis, groups in _mesh_groups(mesh).items():
        families[axis] = groups
    if "groups" in top:
        for name, (knode, vnode) in doc.mapping(top["groups"][1], "groups").items():
            if name in families:
                raise ScheduleError(f"group '{name}' is already defined (world or a mesh axis)", doc.loc(knode))
            families[name] = _custom_groups(doc, name, vnode, env, world_size)
    transport = _enum_value(doc, top, "transport", Transport, Transport.NCCL)
    dtype = _enum_value(doc, top, "dtype", Dtype, Dtype.FP32)
    return WorldLayout(world_size, mesh, streams, families, transport, dtype)


def _enum_value(doc, top, key: str, enum_type, default):
    if key not in top:
        return default
    node = top[key][1]
    try:
        return enum_type(node.value if isinstance(node, yaml.ScalarNode) else None)
    except ValueError:
        choices = [e.value for e in enum_type]
        raise ScheduleError(f"unknown {key} {doc.scalar_text(node)}; expected one of {', '.join(choices)}", doc.loc(node),
                            hint=did_you_mean(str(node.value), choices) if isinstance(node, yaml.ScalarNode) else None) from None  # fmt: skip


def _streams(doc: _YamlFile, top) -> tuple[str, ...]:
    if "streams" not in top:
        return ("compute",)
    node = top["streams"][1]
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise ScheduleError("`streams:` must be a non-empty list of names, e.g. [compute, comm]", doc.loc(node))
    names = []
    for item in node.value:
        name = item.value if isinstance(item, yaml.ScalarNode) else None
        if not isinstance(name, str) or not name.isidentifier():
            raise ScheduleError("stream names must be plain names", doc.loc(item))
        if name == "host":
            raise ScheduleError("'host' is the host thread, not a stream; choose another name", doc.loc(item))
        if name in names:
            raise ScheduleError(f"stream '{name}' is declared twice", doc.loc(item))
        names.append(name)
    return tuple(names)


def _mesh_groups(mesh: tuple[tuple[str, int], ...]) -> dict[str, tuple[Group, ...]]:
    """Groups along each mesh axis: ranks that differ only in that axis's coordinate."""
    out: dict[str, tuple[Group, ...]] = {}
    sizes = [n for _, n in mesh]
    strides = [1] * len(mesh)
    for i in range(len(mesh) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    for a, (axis, n) in enumerate(mesh):
        others = [i for i in range(len(mesh)) if i != a]
        groups = []
        for fixed in itertools.product(*(range(sizes[i]) for i in others)):
            base = sum(c * strides[i] for c, i in zip(fixed, others))
            ranks = tuple(base + k * strides[a] for k in range(n))
            label = ",".join(f"{mesh[i][0]}={c}" for c, i in zip(fixed, others))
            groups.append(Group(f"{axis}[{label}]" if label else axis, axis, ranks))
        out[axis] = tuple(groups)
    return out


def _custom_groups(doc, name: str, node, env, world_size: int) -> tuple[Group, ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise ScheduleError(f"group '{name}' must be a list of ranks, or a list of lists of ranks", doc.loc(node))
    nested = isinstance(node.value[0], yaml.SequenceNode)
    members = node.value if nested else [node]
    groups, seen = [], {}
    for i, member in enumerate(members):
        if not isinstance(member, yaml.SequenceNode) or not member.value:
            raise ScheduleError(f"group '{name}': each member must be a non-empty list of ranks", doc.loc(member))
        ranks = []
        for item in member.value:
            r = _int_value(doc, item, env, f"a rank of group '{name}'", 0)
            if r >= world_size:
                raise ScheduleError(f"group '{name}': rank {r} is out of range (world has ranks 0..{world_size - 1})", doc.loc(item))
            if r in seen:
                raise ScheduleError(f"group '{name}': rank {r} appears twice (a rank may belong to one group of a family)", doc.loc(item))
            seen[r] = i
            ranks.append(r)
        groups.append(Group(f"{name}[{i}]" if nested else name, name, tuple(ranks)))
    return tuple(groups)
