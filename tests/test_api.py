"""The Python API (`import commdsl`): the command line's work as functions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import commdsl
from commdsl.cli import main


def test_importing_commdsl_loads_nothing_heavy():
    code = "import sys, commdsl; commdsl.__all__; print(sorted(m for m in ('torch', 'simpy', 'lark') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_exported_name_resolves():
    for name in commdsl.__all__:
        assert getattr(commdsl, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        commdsl.nope  # noqa: B018


def test_load_takes_params_as_keywords_or_a_mapping():
    a = commdsl.load("1f1b", stages=2, microbatches=4, act="1MiB")
    b = commdsl.load("1f1b", {"stages": 2, "microbatches": "4", "act": "1MiB"})
    assert a == b
    assert a.world_size == 2 and dict(a.params)["microbatches"] == "4"
    assert commdsl.load("1f1b").world_size == 4  # the schedule's own params


def test_simulate_gives_what_the_cli_prints(capsys):
    result = commdsl.simulate(commdsl.load("1f1b", stages=2, microbatches=4), machine="dgx-h100")
    assert main(["simulate", "1f1b", "-p", "stages=2", "-p", "microbatches=4", "--machine", "dgx-h100", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["makespan_us"] == pytest.approx(result.makespan_us, rel=1e-6)
    # The command asks to fold the replicas and says why it did not (1f1b reads its rank);
    # a program loaded here was not asked to (commdsl/dsl/fold.py).
    assert cli.pop("fold") == "not folded: the program reads `rank`"
    assert json.loads(json.dumps({k: v for k, v in result.to_json().items() if k != "fold"})) == cli
    # A schedule name, a Machine object and nodes work too.
    machine = commdsl.load_machine("dgx-h100")
    again = commdsl.simulate("1f1b", machine, nodes=1)
    assert again.program.world_size == 4 and again.machine.topology.nodes == 1


def test_compare_pairs_ops_by_identity(tmp_path):
    result = commdsl.simulate(commdsl.load("gpipe", stages=2, microbatches=2))
    exact = commdsl.compare(result, result.timeline)
    assert exact.makespan_error_pct == 0.0 and len(exact.ops) == result.program.num_ops
    path = tmp_path / "predicted.json"
    result.timeline.write(path)
    slow = commdsl.simulate(commdsl.load("gpipe", stages=2, microbatches=2), network="analytic", machine="a100-nvlink")
    cmp = commdsl.compare(path, slow.timeline)
    assert cmp.makespan_error_pct == pytest.approx((result.makespan_us / slow.makespan_us - 1) * 100, rel=1e-4)  # the file keeps ns
    assert cmp.to_json()["makespan_error_pct"] == pytest.approx(cmp.makespan_error_pct, abs=0.01)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: commdsl.load("no-such-schedule"), "UsageError", "no such schedule file or bundled schedule"),
        (lambda: commdsl.load("1f1b", stages="two"), "ScheduleError", "stages"),
        (lambda: commdsl.load_machine("no-such-machine"), "UsageError", "no such machine file or preset"),
        (lambda: commdsl.load_machine("h100-nvlink", nodes=2), "UsageError", "--nodes needs a machine with a topology"),
        (lambda: commdsl.simulate("1f1b", network="fast"), "UsageError", "unknown network model 'fast'"),
        (lambda: commdsl.compare(commdsl.simulate("gpipe").timeline, commdsl.simulate("1f1b").timeline), "UsageError",
         "different schedules: 'gpipe' \\(predicted\\) vs '1f1b' \\(measured\\)"),
        # a value of the wrong kind: the argument and what it got, never a TypeError from inside
        (lambda: commdsl.metrics(None), "UsageError", "metrics takes a simulation's result .*, got None"),
        (lambda: commdsl.metrics({"makespan_us": 1}), "UsageError", "metrics takes a simulation's result .*, got a dict"),
        (lambda: commdsl.metrics(commdsl.simulate("gpipe").summary()), "UsageError", "got a Summary"),
        (lambda: commdsl.metrics(commdsl.load("gpipe")), "UsageError", "got a Program"),
        (lambda: commdsl.simulate({"a": 1}), "UsageError", "simulate: program must be a Program, .*, got a dict"),
        (lambda: commdsl.simulate(None), "UsageError", "simulate: program must be .*, got None"),
        (lambda: commdsl.simulate(commdsl.Builder(world_size=2)), "UsageError", "got a Builder"),
        (lambda: commdsl.load(None), "UsageError", "load: schedule must be .*, got None"),
        (lambda: commdsl.load(3), "UsageError", "load: schedule must be .*, got 3"),
        (lambda: commdsl.simulate("gpipe", 5), "UsageError", "simulate: machine must be a Machine, .*, got 5"),
        (lambda: commdsl.simulate("gpipe", ["dgx-h100"]), "UsageError", "simulate: machine must be .*, got a list"),
        (lambda: commdsl.load_machine(3), "UsageError", "load_machine: name must be .*, got 3"),
        (lambda: commdsl.load_machine({}), "UsageError", "load_machine: name must be .*, got a dict"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=[2]), "UsageError", "nodes must be a whole number, got a list"),
        (lambda: commdsl.load_machine("dgx-h100", nodes="2"), "UsageError", "nodes must be a whole number, got '2'"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=2.0), "UsageError", "nodes must be a whole number, got 2.0"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=2.5), "UsageError", "nodes must be a whole number, got 2.5"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=float("nan")), "UsageError", "nodes must be a whole number, got nan"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=True), "UsageError", "nodes must be a whole number, got True"),
        (lambda: commdsl.load_machine("dgx-h100", nodes=0), "UsageError", "nodes must be at least 1, got 0"),
        (lambda: commdsl.simulate("gpipe", "dgx-h100", nodes=2.5), "UsageError", "nodes must be a whole number, got 2.5"),
        (lambda: commdsl.simulate("gpipe", commdsl.load_machine("dgx-h100"), nodes="2"), "MachineError",
         "machine dgx-h100: nodes must be a whole number, got '2'"),
        (lambda: commdsl.load_machine("dgx-h100").with_nodes(True), "MachineError", "nodes must be a whole number, got True"),
        (lambda: commdsl.simulate("gpipe", samples=None), "UsageError", "samples must be a whole number, got None"),
        (lambda: commdsl.simulate("gpipe", samples="3"), "UsageError", "samples must be a whole number, got '3'"),
        (lambda: commdsl.simulate("gpipe", network=["flow"]), "UsageError", "network must be the name of a network model .*, got a list"),
        (lambda: commdsl.load("gpipe", max_ops="10"), "UsageError", "max_ops must be a whole number, got '10'"),
        (lambda: commdsl.load("gpipe", max_ops=0), "UsageError", "max_ops must be at least 1, got 0"),
        (lambda: commdsl.load("1f1b", [("stages", 2)]), "UsageError", "load: params must be a mapping .*, got a list"),
        (lambda: commdsl.load("1f1b", "stages=2"), "UsageError", "load: params must be a mapping .*, got 'stages=2'"),
        (lambda: commdsl.compare(None, None), "UsageError", "compare: predicted must be .*, got None"),
        (lambda: commdsl.compare(commdsl.simulate("gpipe"), commdsl.simulate("gpipe")), "UsageError",
         "compare: measured must be a Timeline or a timeline file, got a SimResult"),
        (lambda: commdsl.compare(commdsl.simulate("gpipe"), commdsl.simulate("gpipe").timeline, min_duration_us="x"), "UsageError",
         "min_duration_us must be a number of microseconds from 0, got 'x'"),
        (lambda: commdsl.compare(commdsl.simulate("gpipe"), commdsl.simulate("gpipe").timeline, min_duration_us=float("nan")),
         "UsageError", "min_duration_us must be .*, got nan"),
        (lambda: commdsl.read_timeline(None), "UsageError", "read_timeline: path must be a timeline file, got None"),
    ],
)  # fmt: skip
def test_bad_input_raises_the_commdsl_error(call, error, match):
    with pytest.raises(getattr(commdsl, error), match=match) as info:
        call()
    assert isinstance(info.value, commdsl.CommdslError)


def test_a_result_cannot_be_changed_under_its_outputs():
    """A `SimResult` is frozen: its summary, metrics and timeline are made from its fields."""
    import dataclasses

    result = commdsl.simulate("gpipe")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.makespan_us = -5
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.program = None
    assert result.timeline is result.timeline  # built once, kept
    assert commdsl.metrics(result).makespan_us == result.makespan_us > 0
