"""Positive semantics of the schedule language: what a correct schedule expands to."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import ScheduleError
from commdsl.ir import CopyDir, Dtype, OpKind, ReduceOp, Transport


def schedule(program: str, *, world="1", params: str = "", streams="[compute, comm]", extra: str = "") -> str:
    body = "".join(f"  {line}\n" for line in program.strip("\n").split("\n"))
    params_block = f"params:\n{params}" if params else ""
    return f"name: t\n{params_block}world: {world}\nstreams: {streams}\n{extra}program: |\n{body}"


def load(program: str, overrides=None, **kw):
    return load_schedule_text(schedule(program, **kw), "lang.yaml", overrides)


def names(program: str, rank: int = 0, **kw) -> list[str]:
    return [op.name for op in load(program, **kw).ops[rank]]


def value_of(expr: str, **kw) -> str:
    """The value of `expr` as the language formats an index: compute V[expr]."""
    (name,) = names(f"compute V[{expr}] 1us", **kw)
    return name[2:-1]


# ---- arithmetic and units ------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("7 / 2", "3.5"),
        ("2 ** 10", "1024"),
        ("2 ** 3 ** 2", "512"),
        ("-2 ** 2", "-4"),
        ("2 ** -1", "0.5"),
        ("1.5 * 2", "3"),
        ("10 - 2 - 3", "5"),
        ("1e3", "1000"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1, 2)", "3"),
        ("ceil(7 / 2)", "4"),
        ("floor(7 / 2)", "3"),
        ("log2(8)", "3"),
        ("abs(-3)", "3"),
        ("int(3.9)", "3"),
        ("1 < 2", "true"),
        ("1 < 2 < 3", "true"),
        ("3 > 2 > 2", "false"),
        ("2 == 2.0", "true"),
        ("1 != 1", "false"),
        ("true and not false", "true"),
        ("false or 1 >= 1", "true"),
        ("not 1 > 2 and 2 > 1", "true"),
        ("32MiB / 4", "8MiB"),
        ("32MiB // 3MiB", "10"),
        ("1.5KiB", "1.5KiB"),
        ("1KiB + 512B", "1.5KiB"),
        ("2ms * 3", "6ms"),
        ("3 * 2ms", "6ms"),
        ("1s - 250ms", "750ms"),
        ("500us + 0.5ms", "1ms"),
        ("1ms / 4ms", "0.25"),
        ("4GFLOP / 2", "2GFLOP"),
        ("1TFLOP", "1TFLOP"),
        ("1MB == 1000000B", "true"),
        ("1GB / 1MB", "1000"),
        ("max(1MiB, 2MiB)", "2MiB"),
        ("min(1ms, 10us)", "10us"),
        ("bf16[1024]", "2KiB"),
        ("fp32[256] * 4", "4KiB"),
        ("2MiB > 1MiB", "true"),
        ("1ms == 1000us", "true"),
    ],
)
def test_expression_values(expr, expected):
    assert value_of(expr) == expected


def test_logic_short_circuits():
    # The right side would divide by zero; `or`/`and` must not evaluate it.
    assert value_of("rank == 0 or 1 / 0 == 0") == "true"
    assert value_of("rank == 1 and 1 / 0 == 0") == "false"


def test_quantities_land_in_ops_in_canonical_units():
    prog = load(
        "compute A 2ms * 3\ncompute B 4GFLOP\ncompute C flops=2TFLOP bytes=1.5KiB\nhost H 250us\n"
        "all_reduce g 32MiB / 4\n",
        world="2",
    )
    a, b, c, h, g = prog.ops[0]
    assert (a.kind, a.duration_us, a.flops) == (OpKind.COMPUTE, 6000, None)
    assert (b.duration_us, b.flops) == (None, 4e9)
    assert (c.flops, c.size_bytes) == (2e12, 1536)
    assert (h.kind, h.stream, h.duration_us) == (OpKind.HOST, "host", 250)
    assert (g.kind, g.size_bytes, g.reduce_op) == (OpKind.ALL_REDUCE, 8 * 2**20, ReduceOp.SUM)


def test_dtype_element_counts_set_size_and_dtype():
    prog = load(
        "n = 1024\nall_reduce g bf16[n]\nall_reduce h bf16[n] * 2\nall_gather x 8KiB dtype=fp16\nall_reduce y 4KiB\n",
        world="2",
        extra="dtype: bf16\n",
    )
    g, h, x, y = prog.ops[0]
    assert (g.size_bytes, g.dtype) == (2048, Dtype.BF16)
    assert (h.size_bytes, h.dtype) == (4096, Dtype.BF16)
    assert (x.size_bytes, x.dtype) == (8192, Dtype.FP16)
    assert y.dtype is Dtype.BF16  # the schedule's default dtype
    assert load("all_reduce g int8[3]", world="1").ops[0][0].size_bytes == 3


def test_arithmetic_on_typed_sizes_keeps_the_dtype():
    prog = load(
        "all_gather a 3 * bf16[5]\nall_gather b bf16[30] / 2\nall_gather c bf16[3] + bf16[12]\n"
        "all_gather d bf16[3] + 6B\nall_gather e max(bf16[15], bf16[3])\n",
        world="3",
        extra="dtype: int8\n",
    )
    assert [(op.name, op.size_bytes, op.dtype) for op in prog.ops[0]] == [
        ("a", 30, Dtype.BF16), ("b", 30, Dtype.BF16), ("c", 30, Dtype.BF16),
        ("d", 12, Dtype.INT8),  # mixed element types: the schedule's default
        ("e", 30, Dtype.BF16),
    ]  # fmt: skip


# ---- control flow -------------------------------------------------------------------------------


def test_for_over_ranges():
    assert names("for i in range(3):\n    compute F[i] 1us") == ["F[0]", "F[1]", "F[2]"]
    assert names("for i in range(2, 5):\n    compute F[i] 1us") == ["F[2]", "F[3]", "F[4]"]
    assert names("for i in range(10, 0, -4):\n    compute F[i] 1us") == ["F[10]", "F[6]", "F[2]"]
    assert names("for i in range(0):\n    compute F[i] 1us") == []


def test_if_elif_else_per_rank():
    prog = load(
        "if rank == 0:\n    compute A 1us\nelif rank == 1:\n    compute B 1us\nelif rank == 2:\n    compute C 1us\n"
        "else:\n    compute D 1us\n",
        world="4",
    )
    assert [[op.name for op in ops] for ops in prog.ops] == [["A"], ["B"], ["C"], ["D"]]


def test_local_assignment_and_nested_loops():
    prog = load("total = 0\nfor i in range(3):\n    for j in range(i):\n        total = total + 1\ncompute T[total] 1us")
    assert prog.ops[0][0].name == "T[3]"


def test_def_positional_keyword_and_scoping():
    prog = load(
        "scale = 10\n"
        "def fwd(mb, stage):\n"
        "    local = mb * scale + stage\n"
        "    compute F[local] 1us\n"
        "fwd(1, 2)\n"
        "fwd(stage=4, mb=3)\n"
        "fwd(5, stage=6)\n"
        "local = 99\n"
        "compute G[local] 1us\n"
    )
    assert [op.name for op in prog.ops[0]] == ["F[12]", "F[34]", "F[56]", "G[99]"]


def test_block_locals_do_not_leak():
    with pytest.raises(ScheduleError, match="unknown name 'inner'"):
        load("def f():\n    inner = 1\nf()\ncompute X[inner] 1us")


def test_block_sees_globals_assigned_before_the_call():
    assert names("def f():\n    compute X[g] 1us\ng = 1\nf()\ng = 2\nf()") == ["X[1]", "X[2]"]


def test_a_block_parameter_named_like_a_param_shadows_it_in_the_block():
    # Params compile to constants (commdsl/dsl/compile_base.py `constant`) unless a block
    # parameter takes their name: inside that block the argument is what counts.
    prog = load("def f(size, t):\n    compute F t\n    alloc buf size\n    free buf\nf(1KiB, 3us)\nf(size=2KiB, t=4us)\n"
                "compute G t\nalloc whole size", params="  size: 8KiB\n  t: 5us\n")  # fmt: skip
    assert [(op.kind.value, op.duration_us, op.size_bytes) for op in prog.ops[0]] == [
        ("compute", 3.0, 0), ("alloc", None, 1024), ("free", None, 1024),
        ("compute", 4.0, 0), ("alloc", None, 2048), ("free", None, 2048),
        ("compute", 5.0, 0), ("alloc", None, 8192),
    ]  # fmt: skip


def test_blocks_can_call_blocks_and_recurse_with_a_base_case():
    prog = load("def down(n):\n    if n > 0:\n        compute D[n] 1us\n        down(n - 1)\ndown(3)")
    assert [op.name for op in prog.ops[0]] == ["D[3]", "D[2]", "D[1]"]


def test_indexed_names():
    prog = load(
        "for stage in range(2):\n    for mb in range(2):\n        compute F[stage, mb] 1us\n"
        "copy act[rank * 2 + 1] 1MiB\n"
    )
    assert [op.name for op in prog.ops[0]] == ["F[0,0]", "F[0,1]", "F[1,0]", "F[1,1]", "act[1]"]


def test_assert_passes_and_fails_with_the_schedule_message():
    text = schedule('assert mb % stages == 0, "mb must be a multiple of stages"\ncompute F 1us',
                    params="  stages: 2\n  mb: 4\n")  # fmt: skip
    assert load_schedule_text(text, "a.yaml").num_ops == 1
    with pytest.raises(ScheduleError, match="assertion failed: mb must be a multiple of stages") as info:
        load_schedule_text(text, "a.yaml", {"mb": "3"})
    assert (info.value.loc.line, info.value.loc.column) == (8, 10)  # the `mb % ...` after `assert `


# ---- world, mesh, groups -------------------------------------------------------------------------


def test_mesh_groups_and_coordinates():
    prog = load(
        "compute C[pp.rank, dp.rank, pp.size, dp.size] 1us\n"
        "all_reduce g 4MiB group=dp\n"
        "send_to = rank_at(pp=(pp.rank + 1) % pp.size)\n"
        "compute N[send_to] 1us\n",
        world="{pp: 2, dp: 3}",
    )
    assert prog.world_size == 6
    ids = {g.id: g.ranks for g in prog.groups}
    assert ids["world"] == (0, 1, 2, 3, 4, 5)
    assert ids["pp[dp=0]"] == (0, 3) and ids["pp[dp=2]"] == (2, 5)
    assert ids["dp[pp=0]"] == (0, 1, 2) and ids["dp[pp=1]"] == (3, 4, 5)
    # rank 4 is pp=1, dp=1 (row-major, outermost axis first, as DeviceMesh)
    c, g, n = prog.ops[4]
    assert c.name == "C[1,1,2,3]"
    assert g.group == "dp[pp=1]"
    assert n.name == "N[1]"  # rank_at(pp=0) with dp=1 kept


def test_custom_group_families():
    prog = load(
        "all_reduce g 4MiB group=pairs\nif rank < 2:\n    all_reduce h 4MiB group=low\n",
        world="4",
        extra="groups:\n  pairs: [[0, 2], [1, 3]]\n  low: [0, 1]\n",
    )
    assert {g.id: g.ranks for g in prog.groups}["pairs[1]"] == (1, 3)
    assert [op.group for op in prog.ops[3]] == ["pairs[1]"]
    assert [op.group for op in prog.ops[1]] == ["pairs[1]", "low"]


def test_rooted_collectives_use_global_ranks():
    prog = load("if rank >= 2:\n    broadcast b 4MiB src=3 group=pairs\nreduce r 4MiB dst=0 op=max\n",
                world="4", extra="groups:\n  pairs: [[0, 1], [2, 3]]\n")  # fmt: skip
    b, r = prog.ops[2]
    assert (b.kind, b.root, b.group) == (OpKind.BROADCAST, 3, "pairs[1]")
    assert (r.kind, r.root, r.reduce_op, r.group) == (OpKind.REDUCE, 0, ReduceOp.MAX, "world")


# ---- streams, handles, events ------------------------------------------------------------------


def test_streams_default_on_blocks_and_suffixes():
    prog = load(
        "compute A 1us\non comm:\n    compute B 1us\n    compute C 1us on compute\n    on compute:\n"
        "        compute D 1us\n    compute E 1us\ncompute F 1us on comm\n"
    )
    assert [(op.name, op.stream) for op in prog.ops[0]] == [
        ("A", "compute"), ("B", "comm"), ("C", "compute"), ("D", "compute"), ("E", "comm"), ("F", "comm"),
    ]  # fmt: skip


def test_handles_on_ops_and_batches():
    prog = load(
        "nxt = (rank + 1) % 2\n"
        "h = all_reduce g 4MiB on comm\n"
        "wait h\n"
        "hb = batch:\n    isend a 1MiB to nxt\n    irecv b 1MiB from nxt\n"
        "wait hb on host\n"
        "hs[0] = isend c 1MiB to nxt\nhr[0] = irecv d 1MiB from nxt\nwait hs[0]\nwait hr[0]\n",
        world="2",
    )
    ops = prog.ops[0]
    ar, w, a, b, wb, c, d, wc, wd = ops
    assert ar.handle == "h" and ar.is_async and ar.stream == "comm"
    assert (w.kind, w.waits_for, w.stream) == (OpKind.WAIT, (ar.index,), "compute")
    assert a.batch == b.batch == a.index and a.handle == b.handle == "hb"
    assert (wb.waits_for, wb.stream) == ((a.index, b.index), "host")
    assert (a.kind, a.peer, b.kind, b.peer) == (OpKind.SEND, 1, OpKind.RECV, 1)
    assert (wc.waits_for, wd.waits_for) == ((c.index,), (d.index,))
    assert c.handle == "hs[0]"


def test_blocking_p2p_has_no_handle():
    prog = load("if rank == 0:\n    send x 1MiB to 1 transport=gloo\nelse:\n    recv x 1MiB from 0 transport=gloo\n", world="2")
    (s,), (r,) = prog.ops
    assert s.handle is None and not s.is_async and s.transport is Transport.GLOO
    assert (r.kind, r.peer, r.size_bytes) == (OpKind.RECV, 0, 2**20)


def test_events_wait_for_the_latest_record():
    prog = load("record e on comm\ncompute X 1us on comm\nrecord e on comm\nwait e on compute\n")
    r1, _, r2, w = prog.ops[0]
    assert (r1.kind, r2.kind) == (OpKind.RECORD, OpKind.RECORD)
    assert (w.kind, w.waits_for, w.stream) == (OpKind.WAIT_EVENT, (r2.index,), "compute")


def test_synchronize_and_copy_directions():
    prog = load("synchronize\nsynchronize comm\ncopy a 1MiB from host\ncopy b 1MiB to host\ncopy c 1MiB\n")
    s_all, s_comm, h2d, d2h, d2d = prog.ops[0]
    assert (s_all.kind, s_all.stream, s_all.name) == (OpKind.SYNCHRONIZE, "host", "device")
    assert (s_comm.name, s_comm.stream) == ("comm", "comm")
    assert [op.copy_dir for op in (h2d, d2h, d2d)] == [CopyDir.H2D, CopyDir.D2H, CopyDir.D2D]
    assert h2d.transport is Transport.MEMCPY and h2d.size_bytes == 2**20


def test_unwaited_handle_is_a_warning_not_an_error():
    prog = load("h = all_reduce g 4MiB", world="2")
    assert any("never waited" in w for w in prog.warnings)


# ---- params and overrides ---------------------------------------------------------------------


def test_overrides_reevaluate_dependent_params():
    params = "  base: 1MiB\n  act: 2 * base\n  stages: 2\n  world_n: stages * 2\n"
    text = schedule("all_reduce g act", world="world_n", params=params)
    prog = load_schedule_text(text, "p.yaml")
    assert prog.world_size == 4 and prog.ops[0][0].size_bytes == 2 * 2**20
    prog = load_schedule_text(text, "p.yaml", {"base": "4MiB", "stages": "3"})
    assert prog.world_size == 6 and prog.ops[0][0].size_bytes == 8 * 2**20
    assert dict(prog.params) == {"base": "4MiB", "act": "8MiB", "stages": "3", "world_n": "6"}
    prog = load_schedule_text(text, "p.yaml", {"act": "base / 2"})
    assert prog.ops[0][0].size_bytes == 2**19


def test_param_kinds_from_yaml():
    params = '  i: 3\n  f: 2.5\n  b: true\n  q: "64MiB"\n  e: 2 ** 4\n'
    prog = load_schedule_text(schedule("compute X[i, f, b, e] 1us\nall_reduce g q", params=params), "p.yaml")
    x, g = prog.ops[0]
    assert x.name == "X[3,2.5,true,16]" and g.size_bytes == 64 * 2**20


def test_bundled_schedule_overrides_and_stable_source_name():
    prog = load_schedule("1f1b", {"stages": "2", "microbatches": "4"})
    assert prog.world_size == 2
    assert sum(op.kind is OpKind.COMPUTE for op in prog.ops[0]) == 8
    # A bundled schedule is named the same in every checkout or install.
    assert prog.source == "schedules/1f1b.yaml"
    assert {op.loc.file for ops in prog.ops for op in ops} == {"schedules/1f1b.yaml"}


# ---- source locations ---------------------------------------------------------------------------


def test_op_locations_are_file_lines_and_columns():
    text = (
        "# leading comment\n"
        "\n"
        "name: t  # trailing comment\n"
        "world: 2\n"
        "program: |-\n"
        "    # a comment inside the program\n"
        "    compute A 1us\n"
        "\n"
        "    if rank == 1:\n"
        "        compute B 1us  # trailing comment\n"
        "    h = all_reduce g2 4MiB\n"
        "    wait h\n"
    )
    prog = load_schedule_text(text, "loc.yaml")
    a, b, g, w = prog.ops[1]
    assert (a.loc.file, a.loc.line, a.loc.column) == ("loc.yaml", 7, 5)
    assert a.loc.text == "    compute A 1us"
    assert (b.loc.line, b.loc.column) == (10, 9)
    assert (g.loc.line, g.loc.column) == (11, 9)  # a bound op points at the op, after `h = `
    assert (w.loc.line, w.loc.column) == (12, 5)
    assert [op.loc.line for op in prog.ops[0]] == [7, 11, 12]
    # An error inside the same program points into the same numbering.
    with pytest.raises(ScheduleError) as info:
        load_schedule_text(text.replace("compute B 1us", "compute B 1us on nowhere"), "loc.yaml")
    assert (info.value.loc.line, info.value.loc.column) == (10, 26)


def test_locations_with_explicit_indentation_indicator():
    # With |2 the block's indentation is 2: line 3 is indented by 2 inside the program.
    text = "world: 1\nprogram: |2\n  compute A 1us\n    compute B zz\n"
    with pytest.raises(ScheduleError, match="unexpected indentation") as info:
        load_schedule_text(text, "loc.yaml")
    assert (info.value.loc.line, info.value.loc.column) == (4, 5)
    text = "world: 1\nprogram: |2\n    compute A 1us\n  compute B 1us\n"
    with pytest.raises(ScheduleError, match="first line of the program is indented") as info:
        load_schedule_text(text, "loc.yaml")
    assert (info.value.loc.line, info.value.loc.column) == (3, 5)
    prog = load_schedule_text("world: 1\nprogram: |2\n  compute A 1us\n  compute B 1us\n", "loc.yaml")
    assert [(op.loc.line, op.loc.column) for op in prog.ops[0]] == [(3, 3), (4, 3)]


def test_locations_in_single_line_and_block_programs():
    prog = load_schedule_text("world: 1\nprogram: compute A 1us\n", "one.yaml")
    assert (prog.ops[0][0].loc.line, prog.ops[0][0].loc.column) == (2, 10)
    prog = load_schedule_text("world: 1\nprogram: |+\n   compute A 1us\n\n", "blk.yaml")
    assert (prog.ops[0][0].loc.line, prog.ops[0][0].loc.column) == (3, 4)


# ---- IR JSON and the CLI ---------------------------------------------------------------------


def test_show_json_is_the_ir(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(schedule("h = all_reduce g bf16[8] on comm\nwait h\ncompute F[rank] 2ms", world="2",
                             params="  n: 2\n"))  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "show", str(path), "--json", "-p", "n=3"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["world_size"] == 2 and data["params"] == {"n": "3"}
    assert data["streams"] == ["compute", "comm"]
    ar, w, f = data["ranks"][1]
    assert ar == {"id": "1:0", "rank": 1, "index": 0, "kind": "all_reduce", "name": "g", "stream": "comm",
                  "size_bytes": 16, "group": "world", "reduce_op": "sum", "transport": "nccl", "handle": "h",
                  "dtype": "bf16", "loc": f"{path}:7:7"}  # fmt: skip
    assert w["kind"] == "wait" and w["waits_for"] == [0]
    assert f["name"] == "F[1]" and f["duration_us"] == 2000


def test_no_way_to_run_python():
    root = Path(__file__).resolve().parent.parent / "commdsl"
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        for pattern in (r"\beval\(", r"\bexec\(", r"yaml\.load\(", r"yaml\.unsafe_load", r"yaml\.full_load",
                        r"Loader=yaml\.(Full|Unsafe)?Loader\b", r"__import__\("):  # fmt: skip
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(root)}: {pattern}")
    assert not offenders, offenders
    # Nothing in the language reaches Python: attribute access is only group.rank/.size.
    with pytest.raises(ScheduleError, match="unknown name '__import__'"):
        load("x = __import__")
    with pytest.raises(ScheduleError, match="a group has .rank and .size"):
        load("x = world.__class__")
    with pytest.raises(ScheduleError, match="unknown function 'open'"):
        load("x = open(1)")


def test_ops_store_only_the_rare_fields_they_set():
    """An op that sets none of handle, microbatch, batch and waits_for is the small `Op`;
    one that does is the class that stores them. Whatever its class, an op reads, compares,
    hashes, pickles and replaces as one with every field."""
    import dataclasses
    import pickle
    import sys as _sys

    from commdsl.errors import SourceLoc
    from commdsl.ir import Op

    loc = SourceLoc("s.yaml", 3, 5)
    plain = Op(1, 7, OpKind.COMPUTE, "F[0]", "compute", loc, duration_us=2.0)
    staged = Op(1, 7, OpKind.COMPUTE, "F[0]", "compute", loc, duration_us=2.0, microbatch=4)
    batched = Op(1, 8, OpKind.SEND, "x[0]", "compute", loc, size_bytes=64, peer=2, handle="h", batch=8)
    wait = Op(1, 9, OpKind.WAIT, "h", "compute", loc, waits_for=(8,))
    assert type(plain) is Op and all(isinstance(op, Op) for op in (staged, batched, wait))
    assert len({type(plain), type(staged), type(batched)}) == 3 and type(wait) is type(batched)
    assert _sys.getsizeof(plain) < _sys.getsizeof(staged) < _sys.getsizeof(batched)
    assert (plain.handle, plain.microbatch, plain.batch, plain.waits_for) == (None, None, None, ())
    assert (staged.microbatch, staged.handle, staged.waits_for) == (4, None, ())
    assert (batched.handle, batched.batch, batched.microbatch, wait.waits_for) == ("h", 8, None, (8,))
    for op in (plain, staged, batched, wait):
        assert pickle.loads(pickle.dumps(op)) == op and type(pickle.loads(pickle.dumps(op))) is type(op)
        assert dataclasses.replace(op) == op and op.replace() == op and hash(op.replace()) == hash(op)
        assert dataclasses.asdict(op)["waits_for"] == op.waits_for
    assert staged != plain and staged.replace(microbatch=None) == plain and type(staged.replace(microbatch=None)) is Op
    assert dataclasses.replace(batched, handle=None, batch=None).__class__ is Op
    assert plain.replace(handle="g").handle == "g" and plain.handle is None
