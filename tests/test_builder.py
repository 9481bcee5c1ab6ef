"""`commdsl.Builder`: programs from Python, checked as the language checks schedules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import commdsl
from commdsl.builder import Builder

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


PIPELINER = _example("auto_pipeliner")


def _shape(program: commdsl.Program) -> list[list[tuple]]:
    """Every op's fields but its source location (the Builder's ops point at Python lines)."""
    keep = ("kind", "name", "stream", "duration_us", "flops", "size_bytes", "dtype", "peer", "group", "root", "reduce_op",
            "transport", "batch", "waits_for", "action", "stage", "microbatch")  # fmt: skip
    return [[tuple(getattr(op, f) for f in keep) + (op.handle is None,) for op in ops] for ops in program.ops]


@pytest.mark.parametrize("stages,microbatches", [(2, 1), (4, 8), (5, 3)])
def test_builder_1f1b_is_the_bundled_1f1b(stages, microbatches):
    """The example's 1F1B, built op by op in Python, is the bundled schedule's program
    (every op's every field but its source line) and simulates to the same makespan."""
    built = PIPELINER.one_f_one_b([2000.0] * stages, [512 << 20] * stages, [64 << 20] * stages, microbatches, 32 << 20,
                                  unit="duration_us", dtype="fp32")  # fmt: skip
    loaded = commdsl.load("1f1b", stages=stages, microbatches=microbatches, t_bwd="4ms")
    assert _shape(built) == _shape(loaded)
    assert [g.ranks for g in built.groups] == [g.ranks for g in loaded.groups]
    for network in ("analytic", "flow"):
        a = commdsl.metrics(commdsl.simulate(built, "dgx-h100", network=network))
        b = commdsl.metrics(commdsl.simulate(loaded, "dgx-h100", network=network))
        assert a == b
    assert a.makespan_us > 0 and 0 < a.bubble_fraction < 1
    assert a.peak_memory_bytes[0] == (512 + 512 + 1024 + 64 * min(stages, microbatches)) << 20


def test_every_op_kind_and_mesh_groups():
    b = Builder("all", mesh={"dp": 2, "tp": 2}, streams=("compute", "comm"), groups={"pairs": [[0, 3], [1, 2]]})
    assert b.group_ranks("tp", 2) == (2, 3) and b.group_ranks("dp", 1) == (1, 3)
    assert b.rank_at(dp=1, tp=0) == 2 and b.coords(3) == {"dp": 1, "tp": 1}
    for r in b.ranks:
        assert r.group_rank("tp") == r.coords["tp"]
        r.alloc("buf", 1 << 20)
        r.compute("F", duration_us=10.0)
        r.compute("G", flops=1e9, size_bytes=1 << 20)
        r.host("launch", 5.0)
        r.copy("batch", 1 << 20, "h2d", stream="comm")
        h = r.all_reduce("grads", 4 << 20, group="dp", stream="comm", async_op=True)
        r.record("done", stream="compute")
        r.wait("done", stream="comm")
        r.reduce_scatter("rs", 4 << 20, group="tp", op="avg")
        r.all_gather("ag", 4 << 20, group="tp")
        r.all_to_all("a2a", 4 << 20)
        r.broadcast("bc", 4 << 20, root=b.group_ranks("tp", r.rank)[0], group="tp")
        r.reduce("red", 4 << 20, root=0)
        r.gather("ga", 4 << 20, root=1)
        r.scatter("sc", 4 << 20, root=2)
        partner = b.group_ranks("pairs", r.rank)
        peer = partner[1 - partner.index(r.rank)]
        with r.batch(async_op=True) as hb:
            r.isend("x", 1 << 20, peer, group="pairs")
            r.irecv("y", 1 << 20, peer, group="pairs")
        r.wait(hb)
        r.wait(h, stream="host")
        with r.on("comm"):
            r.barrier(group="tp")
        r.copy("peer", 1 << 20, peer=peer)
        r.free("buf")
        r.synchronize()
    program = b.build()
    kinds = {op.kind.value for op in program.all_ops()}
    assert kinds == {k.value for k in commdsl.ir.OpKind}
    result = commdsl.simulate(program, "dgx-h100")
    m = commdsl.metrics(result)
    assert m.peak_memory_bytes == (1 << 20,) * 4
    assert len(m.exposed_comm_us) == 4 and m.makespan_us > 0


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.rstrip().endswith(marker))


def test_an_error_names_the_callers_line():
    b = Builder(world_size=2)
    with pytest.raises(commdsl.ScheduleError) as err:
        b.rank(0).send("x", 8, peer=5)  # MARK-peer
    assert err.value.loc.file == __file__ and err.value.loc.line == _line("# MARK-peer")
    assert err.value.rank == 0
    assert "peer 5 is out of range" in err.value.format() and "MARK-peer" in err.value.format()


BAD = [
    # (what the caller does, the message's words)
    (lambda b: b.rank(0).send("x", 8, peer=0), "cannot send to itself"),
    (lambda b: b.rank(0).send("x", 8, peer=1, group="tp"), "unknown group 'tp'"),
    (lambda b: b.rank(0).compute("F"), "compute needs duration_us="),
    (lambda b: b.rank(0).compute("F", duration_us=-1), "must not be negative"),
    (lambda b: b.rank(0).compute("F", duration_us=float("nan")), "finite number"),
    (lambda b: b.rank(0).compute("F", duration_us=1, stream="comm"), "unknown stream 'comm'"),
    (lambda b: b.rank(0).compute("F", duration_us=1, action="forward"), "action=, stage= and microbatch= together"),
    (lambda b: b.rank(0).compute("F", duration_us=1, action="fwd", stage=0, microbatch=0), "unknown action 'fwd'"),
    (lambda b: b.rank(0).all_reduce("g", 7, dtype="fp32"), "not a multiple of the fp32 element size"),
    (lambda b: b.rank(0).all_gather("g", 4, dtype="fp32"), "does not split into 2 equal chunks"),
    (lambda b: b.rank(0).broadcast("g", 8, root=9), "root 9 is out of range"),
    (lambda b: b.rank(0).all_gather("g", 8, op="sum"), "does not reduce"),
    (lambda b: b.rank(0).all_reduce("g", 8, algo="rings"), "unknown algo 'rings'"),
    (lambda b: b.rank(0).free("nothing"), "no live buffer"),
    (lambda b: (b.rank(0).alloc("a", 8), b.rank(0).alloc("a", 8)), "already allocated"),
    (lambda b: b.rank(0).send("x", 2**62, peer=1), "more than the limit"),
    (lambda b: b.rank(7), "rank 7 is out of range"),
    (lambda b: (b.rank(0).wait("h"), b.build()), "no handle or event of that name"),
    (lambda b: (b.rank(0).send("x", 8, peer=1), b.build()), "send"),
    (lambda b: b.rank(0).barrier(root=0), "barrier takes no root="),
    (lambda b: b.rank(0).compute("c", 10**400), "beyond every limit"),
    (lambda b: b.rank(0).host("h", None), "host needs duration_us="),
    (lambda b: b.rank(0).send("x", 8, peer=1, group=["world"]), "group must be a group family's name"),
    (lambda b: b.rank(0).group_rank("zzz"), "unknown group 'zzz'"),
    (lambda b: b.rank(0).group_rank(None), "group must be a group family's name"),
    (lambda b: b.rank(0).all_reduce("g", 8, async_op="no"), "async_op= must be True or False"),
    (lambda b: b.rank(0).compute(None, 1), "op name must be a non-empty str"),
    (lambda b: b.rank(0).record(5), "event name must be a non-empty str"),
    (lambda b: b.rank(0).compute("c", size_bytes=1.5), "size_bytes must be a whole number"),
    (lambda b: b.rank(0).send("x", None, peer=1), "size_bytes must be a finite number"),
    (lambda b: b.rank(0).compute("c", 1, stream=["a"]), "stream= must be a stream's name"),
    (lambda b: b.coords(2), "rank 2 is out of range"),
    (lambda b: b.coords(-1), "rank -1 is out of range"),
    (lambda b: b.coords("a"), "rank must be an integer rank"),
    (lambda b: b.rank_at(pp=0), "'pp' is not a mesh axis (axes: none)"),
    (lambda b: b.rank_at(world=9), "'world' is not a mesh axis"),
    (lambda b: b.rank_at(), "a flat world (world_size=) has no mesh coordinates"),
    (lambda b: Builder(mesh={"pp": 2, "dp": 2}).rank_at(pp=0), "no coordinate for mesh axis 'dp'"),
    (lambda b: Builder(mesh={"pp": 2, "dp": 2}).rank_at(pp=0, dp=0, zz=1), "'zz' is not a mesh axis (axes: pp, dp)"),
    (lambda b: Builder(mesh={"pp": 2, "dp": 2}).rank_at(pp="a", dp=0), "pp='a' is outside the mesh (pp is 0..1)"),
    (lambda b: Builder(mesh={"pp": 2, "dp": 2}).rank_at(pp=2, dp=0), "pp=2 is outside the mesh"),
    (lambda b: Builder(mesh={"pp": 2, "dp": 2}).coords(9), "rank 9 is out of range"),
]


@pytest.mark.parametrize("call,words", BAD, ids=[w for _, w in BAD])
def test_bad_calls(call, words):
    with pytest.raises(commdsl.ScheduleError) as err:
        call(Builder(world_size=2))
    assert words in err.value.format()
    assert err.value.loc is not None and err.value.loc.file == __file__


@pytest.mark.parametrize("kwargs,words", [
    ({}, "either world_size= (a rank count) or mesh="),
    ({"world_size": 0}, "world_size must be an integer >= 1"),
    ({"mesh": {"pp": 2}, "streams": ("compute", "host")}, "'host' is the host thread"),
    ({"mesh": {"pp": 2}, "streams": ("a", "a")}, "declared twice"),
    ({"world_size": 4, "groups": {"g": [[0, 1], [1, 2]]}}, "rank 1 appears twice"),
    ({"world_size": 4, "groups": {"g": [0, 9]}}, "rank 9 is out of range"),
    ({"world_size": 70_000}, "exceeds the limit"),
    ({"world_size": 2, "transport": "tcp"}, "unknown transport 'tcp'"),
    ({"mesh": [("pp", 2)]}, "mesh= must be a mapping of axis name to size"),
    ({"mesh": "pp"}, "mesh= must be a mapping of axis name to size"),
    ({"world_size": 4, "groups": [("pairs", [0])]}, "groups= must be a mapping"),
    ({"world_size": 4, "groups": {"pairs": 5}}, "group 'pairs' must be a list of ranks"),
    ({"world_size": 2, "params": [1, 2]}, "params= must be a mapping"),
    ({"world_size": 2, "max_ops": "10"}, "max_ops must be an integer >= 1"),
    ({"world_size": 2, "max_ops": None}, "max_ops must be an integer >= 1"),
    ({"world_size": 2, "max_ops": float("nan")}, "max_ops must be an integer >= 1"),
    ({"world_size": 2, "max_ops": 1.5}, "max_ops must be an integer >= 1"),
    ({"world_size": 2, "streams": 5}, "streams= must be a non-empty list"),
])  # fmt: skip
def test_bad_builders(kwargs, words):
    with pytest.raises(commdsl.ScheduleError) as err:
        Builder(**kwargs)
    assert words in err.value.format() and err.value.loc.file == __file__


def test_deadlock_and_memory_errors_name_the_python_lines():
    b = Builder(world_size=2)
    b.rank(0).send("x", 8, peer=1)  # MARK-head-0
    b.rank(1).send("x", 8, peer=0)
    b.rank(0).recv("x", 8, peer=1)
    b.rank(1).recv("x", 8, peer=0)
    with pytest.raises(commdsl.DeadlockError) as err:
        commdsl.simulate(b.build(), "dgx-h100")
    assert f"{Path(__file__).name}:{_line('# MARK-head-0')}" in err.value.format()

    b = Builder(world_size=1)
    b.rank(0).alloc("huge", 200 << 30)  # MARK-huge
    b.rank(0).compute("F", duration_us=1)
    with pytest.raises(commdsl.MemoryExceededError) as err:
        commdsl.simulate(b.build(), "dgx-h100")
    assert err.value.exit_code == 5


def test_op_limit_and_single_use():
    b = Builder(world_size=2, max_ops=3)
    for r in b.ranks:
        r.compute("F", duration_us=1)
        r.compute("G", duration_us=1)
    with pytest.raises(commdsl.LimitError, match="more than 3 ops"):
        b.build()
    b = Builder(world_size=1)
    b.rank(0).compute("F", duration_us=1)
    b.build()
    with pytest.raises(commdsl.UsageError):
        b.build()


def test_after_build_every_call_is_an_error_at_the_callers_line():
    b = Builder(world_size=1)
    r = b.rank(0)
    r.compute("F", duration_us=1)
    program = b.build()
    for call in (lambda: r.compute("G", duration_us=1), lambda: b.rank(0), lambda: b.build()):
        with pytest.raises(commdsl.UsageError, match="already built") as err:
            call()
        assert err.value.loc is not None and err.value.loc.file == __file__
    assert program.num_ops == 1
    with pytest.raises(commdsl.UsageError) as err:
        r.wait("x")  # MARK-kept-wait
    assert err.value.loc.line == _line("# MARK-kept-wait")


def test_auto_handles_skip_taken_names_and_rebinding_warns_as_in_a_schedule():
    b = Builder(world_size=2)
    r0 = b.rank(0)
    h1 = r0.isend("a", 8, peer=1)
    r0.isend("b", 8, peer=1, handle="isend#2")
    h3 = r0.isend("c", 8, peer=1)
    assert (h1, h3) == ("isend#1", "isend#3")
    for h in (h1, "isend#2", h3):
        r0.wait(h)
    r0.isend("d", 8, peer=1, handle="h")
    r0.isend("e", 8, peer=1, handle="h")  # the first is never waited: a warning, as a schedule's `h = isend` twice
    r0.wait("h")
    for n in "abcde":
        b.rank(1).recv(n, 8, peer=0)
    program = b.build()
    assert [op.handle for op in program.ops[0] if op.kind.value == "send"] == ["isend#1", "isend#2", "isend#3", "h", "h"]
    assert any("handle 'h' rebound before it was waited" in w for w in program.warnings)


def test_coords_and_rank_at_round_trip():
    b = Builder(mesh={"pp": 2, "dp": 3})
    for r in range(6):
        assert b.rank_at(**b.coords(r)) == r
    assert Builder(world_size=2).coords(1) == {}


def test_machines_load_once(tmp_path):
    assert commdsl.load_machine("dgx-h100") is commdsl.load_machine("dgx-h100")
    path = tmp_path / "mine.yaml"
    text = (ROOT / "commdsl" / "machine" / "presets" / "h100-nvlink.yaml").read_text()
    path.write_text(text)
    first = commdsl.load_machine(path)
    assert commdsl.load_machine(str(path)) is first
    path.write_text(text + "\n# changed\n")  # another size: the file is read again
    assert commdsl.load_machine(path) is not first
    assert commdsl.load_machine("dgx-h100", nodes=2).num_devices == 16
    with pytest.raises(commdsl.UsageError):
        commdsl.load_machine("no-such-machine")


@pytest.mark.parametrize("schedule,params", [("1f1b", {"stages": 4}), ("tp_mlp", {}), ("fsdp", {})])
def test_metrics_are_the_summarys(schedule, params):
    result = commdsl.simulate(commdsl.load(schedule, **params), "dgx-h100")
    summary, m = result.summary(), commdsl.metrics(result)
    assert m.makespan_us == summary.makespan_us and m.bubble_fraction == summary.bubble_fraction
    assert m.exposed_comm_us == tuple(r.exposed_comm_us for r in summary.ranks)
    assert m.compute_us == tuple(r.compute_us for r in summary.ranks)
    peaks = {mem.rank: mem.peak_bytes for mem in summary.memory}
    assert m.peak_memory_bytes == tuple(peaks.get(r, 0) for r in range(summary.world_size))
