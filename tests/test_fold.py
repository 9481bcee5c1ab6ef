"""Folding the replicas along a mesh axis (commdsl/dsl/fold.py, commdsl/sim/folding.py):
one replica is expanded, checked and simulated for all. Every case runs both ways, folded
and every rank expanded, on worlds small enough for both: a folded simulation gives the
same makespan, bubble, per-rank times and peak memory per rank; a schedule that tells the
replicas apart is not folded (its note says why) and gives exactly what the unfolded
load gives, program or error."""

from __future__ import annotations

import json

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import CommdslError, DeadlockError, UsageError
from commdsl.machine import resolve_machine
from commdsl.resources import bundled_schedules
from commdsl.sim import check_deadlock, simulate

SMALL = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 512, "seq": 64, "microbatches": 4, "pp": 2}


def _llm(fold: bool, **params):
    return load_schedule("llm_3d", {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in {**SMALL, **params}.items()},
                         fold=fold)  # fmt: skip


def _same_results(folded, unfolded) -> None:
    a, b = folded.summary().to_json(), unfolded.summary().to_json()
    for key in ("makespan_us", "bubble_fraction", "ranks", "memory", "num_ops", "world_size", "transfers", "slowed"):
        assert a[key] == b[key], key
    assert a["ranks"] and a["memory"] and len(a["memory"]) == folded.program.world_size


CASES = [
    pytest.param({"dp": 2, "tp": 2}, id="dp2-tp2"),
    pytest.param({"dp": 4, "tp": 2}, id="dp4-tp2"),
    pytest.param({"dp": 4, "tp": 2, "fsdp": True}, id="dp4-tp2-fsdp"),
    pytest.param({"dp": 2, "tp": 2, "gpipe": True, "sequence_parallel": True}, id="dp2-tp2-gpipe-sp"),
]


@pytest.mark.parametrize("params", CASES)
def test_folded_llm_3d_simulates_as_every_rank_without_contention(params):
    folded, unfolded = _llm(True, **params), _llm(False, **params)
    fold = folded.fold
    assert fold is not None and fold.axis == "dp" and fold.replicas == params["dp"], folded.fold_note
    assert folded.num_ops * fold.replicas == folded.total_ops == unfolded.num_ops
    for rank in fold.ranks:
        assert folded.ops[rank] == unfolded.ops[rank]
    assert all(not folded.ops[r] for r in range(folded.world_size) if r not in fold.ranks)
    machine = resolve_machine("dgx-h100", nodes=2)
    _same_results(simulate(folded, machine, "analytic"), simulate(unfolded, machine, "analytic"))


@pytest.mark.parametrize("params", [pytest.param({"dp": 2}, id="dp2"), pytest.param({"dp": 4, "fsdp": True}, id="dp4-fsdp")])
def test_folded_llm_3d_simulates_as_every_rank_on_the_flow_network(params):
    """TP 8: each replica on whole nodes of its own, where the flow network's contention is
    the same folded (commdsl/sim/folding.py)."""
    folded, unfolded = _llm(True, tp=8, heads=8, kv_heads=8, **params), _llm(False, tp=8, heads=8, kv_heads=8, **params)
    machine = resolve_machine("dgx-h100", nodes=2 * params["dp"])
    assert folded.fold is not None
    a, b = simulate(folded, machine), simulate(unfolded, machine)
    _same_results(a, b)
    # The links of the representative's nodes, as a run of every rank loads them; every
    # other replica's nodes carry as many links.
    links, every_rank = a.summary().to_json()["links"], {link["name"]: link for link in b.summary().to_json()["links"]}
    assert links and all(every_rank[link["name"]] == link for link in links)
    assert len(every_rank) == params["dp"] * len(links)


def test_replicas_smaller_than_a_node_fold_in_blocks_of_whole_nodes(capsys):
    """TP 4 on 8-GPU nodes: one replica fills half a node, so two consecutive replicas
    stand for the rest, each pair on a node of its own; on the flow network that is what a
    run of every rank gives, links included."""
    params = {"dp": 4, "tp": 4, "heads": 4, "kv_heads": 4}
    text = {k: str(v) for k, v in {**SMALL, **params}.items()}
    folded, unfolded = load_schedule("llm_3d", text, fold=True, fold_unit=8), _llm(False, **params)
    fold = folded.fold
    assert (fold.axis, fold.block, fold.replicas, fold.stride, fold.label) == ("dp", 2, 2, 8, "dp < 2"), folded.fold_note
    assert fold.ranks == (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)  # pp stride 16: dp 0-1 of each stage
    assert "the 16 ranks with dp < 2 run for all 4 replicas, 2 at a time" in folded.fold_note
    assert folded.num_ops * fold.replicas == unfolded.num_ops
    assert load_schedule("llm_3d", text, fold=True).fold.block == 1  # no node size given: one replica
    for bad in (0, -8, 2.5):
        with pytest.raises(UsageError, match="fold_unit is the GPUs of a node"):
            load_schedule("llm_3d", text, fold=True, fold_unit=bad)
    machine = resolve_machine("dgx-h100", nodes=4)
    a, b = simulate(folded, machine), simulate(unfolded, machine)
    _same_results(a, b)
    links, every_rank = a.summary().to_json()["links"], {link["name"]: link for link in b.summary().to_json()["links"]}
    assert links and all(every_rank[link["name"]] == link for link in links)
    # The command folds so on a machine of 8-GPU nodes.
    args = ["llm_3d", *(f"-p{k}={v}" for k, v in text.items()), "--machine", "dgx-h100", "--nodes", "4", "--json"]
    assert main(["simulate", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fold"].startswith("folded along dp: the 16 ranks with dp < 2") and out["makespan_us"] == b.summary().to_json()["makespan_us"]


def test_a_fold_whose_replicas_meet_a_tree_on_their_nics_is_kept_and_warned():
    """NCCL's tree loads its inner nodes' NICs more than its leaves'. DP 4 over 4 nodes with
    the tree (a machine whose `nccl.algo` is tree) and PP 2, whose sends cross nodes too:
    the folded run may differ a little from a run of every rank, so it warns. With rings
    (NCCL's own choice at these sizes), with PP 1 (nothing of a replica crosses nodes) and
    on the analytic network it is exact, and says nothing."""
    import dataclasses

    from commdsl.ir import Algo

    def with_trees(machine):
        return dataclasses.replace(machine, nccl=dataclasses.replace(machine.nccl, algos=frozenset({Algo.TREE})))

    machine = resolve_machine("dgx-h100", nodes=8)
    trees = with_trees(machine)
    params = {"tp": 8, "heads": 8, "kv_heads": 8, "dp": 4}
    program = _llm(True, **params)

    def warned(result) -> list[str]:
        return [w for w in result.warnings if w.startswith("folded along")]

    (warning,) = warned(simulate(program, trees))
    assert warning.startswith("folded along dp: all_reduce G_bucket[0]") and "tree" in warning and "--no-fold" in warning
    assert not warned(simulate(program, machine))
    assert not warned(simulate(program, trees, "analytic"))
    one_stage = _llm(True, **{**params, "pp": 1, "layers": 2})
    assert not warned(simulate(one_stage, with_trees(resolve_machine("dgx-h100", nodes=4))))


def test_a_folded_program_refuses_a_machine_where_replicas_share_links():
    folded = _llm(True, dp=2, tp=2)  # the replicas are 2 ranks apart: on one 8-GPU node
    with pytest.raises(UsageError, match="share nodes"):
        simulate(folded, resolve_machine("dgx-h100"))
    with pytest.raises(UsageError, match="--samples"):
        simulate(folded, resolve_machine("dgx-h100"), "analytic", samples=3)


def test_simulate_command_unfolds_where_folding_is_not_exact(capsys):
    args = ["llm_3d", *(f"-p{k}={v}" for k, v in {**SMALL, "dp": 2, "tp": 2}.items()), "--machine", "dgx-h100", "--json"]
    assert main(["simulate", *args]) == 0
    flow = json.loads(capsys.readouterr().out)
    assert flow["fold"].startswith("not folded along dp: the dp replicas are 2 ranks apart")
    assert main(["simulate", *args, "--network", "analytic"]) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert analytic["fold"].startswith("folded along dp")
    assert main(["simulate", *args, "--network", "analytic", "--no-fold"]) == 0
    every_rank = json.loads(capsys.readouterr().out)
    assert every_rank["fold"] == ""
    for key in ("makespan_us", "bubble_fraction", "ranks", "memory", "num_ops"):
        assert analytic[key] == every_rank[key], key


def test_check_command_folds_and_counts_every_rank(capsys):
    args = ["llm_3d", *(f"-p{k}={v}" for k, v in {**SMALL, "dp": 4, "tp": 2}.items()), "--json"]
    assert main(["check", *args]) == 0
    folded = json.loads(capsys.readouterr().out)
    assert main(["check", *args, "--no-fold"]) == 0
    unfolded = json.loads(capsys.readouterr().out)
    assert folded["fold"].startswith("folded along dp") and unfolded["fold"] == ""
    assert folded["ops_expanded"] * 4 == folded["ops"] == unfolded["ops"] == unfolded["ops_expanded"]
    for key in ("ops_by_kind", "bytes_by_transport", "world_size", "groups"):
        assert folded[key] == unfolded[key], key


HEAD = """\
name: t
world: {pp: 2, dp: 3}
streams: [compute, comm]
groups:
  mixed: [[0, 4], [1, 3], [2, 5]]
  first: [0, 3]
program: |
"""

PIPELINE = ["prev = rank_at(pp=0)", "next = rank_at(pp=1)", "alloc acts 64MiB", "compute F 1ms", "if pp.rank == 0:", "    send a 4MiB to next",
            "else:", "    recv a 4MiB from prev", "h = all_reduce g 8MiB group=dp on comm", "compute B 2ms", "free acts", "wait h"]
"""Folds along dp: stages exchange within their replica, gradients are reduced across."""

BREAKERS = {
    "reads_rank": (["if rank == 3:", "    compute X 1ms"], "reads `rank`"),
    "reads_dp_rank": (["compute X 1ms * (dp.rank + pp.rank + 1)"], "`dp.rank` is read"),
    "rank_at_sets_dp": (["compute X 1ms", "all_reduce g 4MiB group=dp", "send z 1MiB to rank_at(dp=0)"], "`rank_at(dp=...)` is read"),
    "rank_at_value_as_a_number": (["if rank_at(pp=0) == 4:", "    compute X 1ms"], "a value of rank_at() (t.yaml:"),
    "rank_at_value_in_a_name": (["compute X[rank_at(pp=0)] 1ms"], "used as a number"),
    "peer_in_another_replica": (["if pp.rank == 0:", "    send x 4MiB to 4", "else:", "    recv x 4MiB from 1"], "in replica 1"),
    "group_across_replicas_unevenly": (["all_reduce x 4MiB group=mixed"], "neither lies in one replica"),
    "group_without_a_copy_in_the_other_replicas": (["all_reduce x 4MiB group=first"], "has no copy in replica 1"),
    "rooted_collective_across_replicas": (["broadcast w 4MiB src=0 group=dp"], "a broadcast on group dp"),
    "a_warning": (["h = all_reduce g 4MiB group=dp"], "warns"),
}


def _load_text(lines: list[str], fold: bool):
    text = HEAD + "".join(f"  {line}\n" for line in lines)
    try:
        return load_schedule_text(text, "t.yaml", fold=fold)
    except CommdslError as err:
        return ("error", type(err).__name__, err.format())


@pytest.mark.parametrize("lines, reason", BREAKERS.values(), ids=BREAKERS.keys())
def test_a_schedule_that_tells_replicas_apart_is_not_folded(lines, reason):
    folded, unfolded = _load_text(lines, True), _load_text(lines, False)
    if isinstance(unfolded, tuple):  # an error: the same with folding asked for
        assert folded == unfolded
        return
    assert folded.fold is None
    assert folded.fold_note.startswith("not folded") and reason in folded.fold_note, folded.fold_note
    assert folded.to_json() == unfolded.to_json()


def test_a_pipeline_with_gradients_across_replicas_folds_and_simulates_the_same():
    folded, unfolded = _load_text(PIPELINE, True), _load_text(PIPELINE, False)
    assert folded.fold is not None and folded.fold.ranks == (0, 3), folded.fold_note
    machine = resolve_machine("dgx-h100")  # the replicas share its node: the analytic network, without contention
    _same_results(simulate(folded, machine, "analytic"), simulate(unfolded, machine, "analytic"))
    check_deadlock(folded)


def test_a_folded_deadlock_is_reported():
    lines = ["prev = rank_at(pp=0)", "next = rank_at(pp=1)", "if pp.rank == 0:", "    recv a 4MiB from next", "    send b 4MiB to next",
             "else:", "    recv b 4MiB from prev", "    send a 4MiB from prev"]  # fmt: skip
    lines[-1] = "    send a 4MiB to prev"
    folded, unfolded = _load_text(lines, True), _load_text(lines, False)
    assert folded.fold is not None, folded.fold_note
    for program in (folded, unfolded):
        with pytest.raises(DeadlockError):
            check_deadlock(program)


@pytest.mark.parametrize("name", bundled_schedules())
def test_every_bundled_schedule_that_folds_simulates_as_every_rank(name):
    """With its own params, on a machine without a topology (each rank its own links: the
    flow network is exact folded) and on dgx-h100 with the analytic network; its links are
    those of the run of every rank."""
    folded = load_schedule(name, fold=True)
    if folded.fold is None:
        assert not folded.fold_note or folded.fold_note.startswith("not folded: ")
        return
    unfolded = load_schedule(name)
    for machine, network in ((resolve_machine("h100-nvlink"), "flow"), (resolve_machine("dgx-h100"), "analytic")):
        a, b = simulate(folded, machine, network), simulate(unfolded, machine, network)
        if a.summary().memory:
            _same_results(a, b)
        else:
            _same_times(a, b)
        every_rank = {link["name"]: link for link in b.summary().to_json()["links"]}
        assert all(every_rank[link["name"]] == link for link in a.summary().to_json()["links"])


def _same_times(folded, unfolded) -> None:
    a, b = folded.summary().to_json(), unfolded.summary().to_json()
    for key in ("makespan_us", "bubble_fraction", "ranks", "num_ops", "transfers", "slowed"):
        assert a[key] == b[key], key
