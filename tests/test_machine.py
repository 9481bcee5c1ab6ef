"""Machine descriptions: presets, validation errors with file:line:col, --machine."""

from __future__ import annotations

import pytest

from commdsl.cli import main
from commdsl.errors import MachineError, UsageError
from commdsl.ir import Dtype, Transport
from commdsl.machine import DEFAULT_MACHINE, load_machine_text, preset_names, resolve_machine

GOOD = """\
name: tiny
devices: 2
device:
  name: test
  peak_tflops: {fp32: 10, bf16: 20}
  memory_bandwidth_gb_per_s: 100
  sm_count: 8
kernel_launch_us: 4
comm_launch_us: 10
host_link: {latency_us: 1, bandwidth_gb_per_s: 25}
transports:
  nccl: {latency_us: 5, bandwidth_gb_per_s: 200}
"""


def test_device_memory_from_presets_and_files(machine_error):
    assert resolve_machine("h100-nvlink").device.memory_bytes == int(79.65 * 2**30)
    assert resolve_machine("a100-nvlink").device.memory_gib == 80
    assert resolve_machine("pcie-nvlink-pairs").device.memory_gib == 24
    assert resolve_machine("cpu-loopback").device.memory_gib == 4
    assert load_machine_text(GOOD, "m.yaml").device.memory_bytes is None  # optional: no limit
    assert load_machine_text(GOOD.replace("  sm_count: 8\n", "  sm_count: 8\n  memory_gib: 0.5\n"), "m.yaml").device.memory_bytes == 2**29
    machine_error(GOOD.replace("  sm_count: 8\n", "  sm_count: 8\n  memory_gib: -1\n"), "m.yaml",
                  "device.memory_gib must be greater than 0", 8, 15)


def test_presets_load_and_cover_what_the_issue_asks():
    assert {"h100-nvlink", "a100-nvlink", "cpu-loopback"} <= set(preset_names())
    assert DEFAULT_MACHINE == "h100-nvlink"
    h100 = resolve_machine("h100-nvlink")
    assert h100.num_devices == 8 and h100.device.sm_count == 132
    assert h100.device.tflops(Dtype.BF16) == 989
    assert h100.transport(Transport.NCCL).bandwidth_gb_per_s > 0
    cpu = resolve_machine("cpu-loopback")
    assert cpu.transport(Transport.GLOO) is not None
    # The CPU executor carries nccl ops over gloo: same costs.
    assert cpu.transport(Transport.NCCL) == cpu.transport(Transport.GLOO)


def test_good_file_loads_with_every_field():
    m = load_machine_text(GOOD, "tiny.yaml")
    assert m.name == "tiny" and m.kernel_launch_us == 4 and m.comm_launch_us == 10
    assert m.device.tflops(Dtype.FP32) == 10 and m.device.tflops(Dtype.FP64) is None
    assert m.host_link.transfer_us(25e3) == pytest.approx(2.0)  # 1 us + 25 KB at 25 GB/s
    assert m.chunk_bytes == 512 * 1024


def test_zero_overheads_and_infinite_bandwidth_are_allowed():
    m = load_machine_text(GOOD.replace("kernel_launch_us: 4", "kernel_launch_us: 0").replace("bandwidth_gb_per_s: 200", "bandwidth_gb_per_s: .inf"), "m.yaml")
    assert m.kernel_launch_us == 0
    assert m.transport(Transport.NCCL).transfer_us(1e12) == 5.0


BY_OP = "interference_by_op:\n  reduce_scatter:\n    bf16: {comm_compute_slowdown: 1.9, compute_comm_slowdown: 1.3}\n"
"""Appended to GOOD in the table of bad inputs (lines 13-15)."""


@pytest.mark.parametrize(
    "old,new,message,line,col",
    [
        ("bandwidth_gb_per_s: 200", "bandwidth_gb_per_s: -3", "transports.nccl.bandwidth_gb_per_s must be greater than 0, got -3", 12, 45),
        ("sm_count: 8", "sm_count: 8.5", "device.sm_count must be a whole number, got 8.5", 7, 13),
        ("fp32: 10", "fp33: 10", "unknown dtype 'fp33'", 5, 17),
        ("nccl:", "nvlink:", "unknown transport 'nvlink' (known: nccl, gloo, memcpy)", 12, 3),
        ("comm_launch_us: 10", "comm_launch_usec: 10", "unknown key 'comm_launch_usec'", 9, 1),
        ("kernel_launch_us: 4", "kernel_launch_us: 4e0", "kernel_launch_us must be a number, got '4e0'", 8, 19),
        ("{latency_us: 1, bandwidth_gb_per_s: 25}", "{latency_us: 1}", "host_link is missing 'bandwidth_gb_per_s'", 10, 12),
        ("memory_bandwidth_gb_per_s: 100", "memory_bandwidth_gb_per_s: .nan", "must be a finite number or .inf, got .nan", 6, 30),
        ("reduce_scatter:", "reduce_scater:", "interference_by_op: 'reduce_scater' is not a comm op", 14, 3),
        ("reduce_scatter:", "compute:", "interference_by_op: 'compute' is not a comm op", 14, 3),
        ("    bf16:", "    bf15:", "interference_by_op.reduce_scatter (or 'any'): unknown dtype 'bf15'", 15, 5),
        ("1.9,", "0.5,", "interference_by_op.reduce_scatter.bf16.comm_compute_slowdown must be at least 1.0", 15, 35),
        ("compute_comm_slowdown: 1.3", "compute_comm: 1.3", "interference_by_op.reduce_scatter.bf16: unknown key 'compute_comm'", 15, 40),
        ("comm_compute_slowdown: 1.9, ", "", "interference_by_op.reduce_scatter.bf16 is missing 'comm_compute_slowdown'", 15, 11),
    ],
)
def test_validation_errors_name_file_line_col_and_value(old, new, message, line, col, machine_error):
    text = GOOD + BY_OP
    assert old in text
    err = machine_error(text.replace(old, new, 1), "tiny.yaml", message, line, col)
    assert new.split(":")[0].strip("{ ") in err.format()  # the offending line is shown


PROFILED = GOOD.replace("  nccl: {latency_us: 5, bandwidth_gb_per_s: 200}\n", """\
  nccl:
    latency_us: 5
    bandwidth_gb_per_s: 200
    collectives:
      all_reduce:
        latency_us: 5
        bandwidth_gb_per_s: 200
        measured_ranks: 2
        measured_us: [[1, 5], [2, 9]]
        measured_us_by_op: {avg: {fp32: [[1, 6], [2, 10]]}}
""")
"""GOOD with a calibrated all_reduce (measured_us_by_op on line 21)."""


@pytest.mark.parametrize(
    "old,new,message,line,col",
    [
        ("avg: {", "average: {", "measured_us_by_op: reduce op 'average' has no place here; known: avg, max, min, prod", 21, 29),
        ("avg: {", "sum: {", "(sum's tables are measured_us and measured_us_by_dtype)", 21, 29),
        ("{fp32: [[1, 6]", "{fp31: [[1, 6]", "collectives.all_reduce.measured_us_by_op.avg: unknown dtype 'fp31'", 21, 35),
        ("      all_reduce:", "      all_gather:", "only reductions (all_reduce, reduce, reduce_scatter) have a reduce op, not all_gather", 21, 9),
        ("        measured_ranks: 2\n        measured_us: [[1, 5], [2, 9]]\n", "", "collectives.all_reduce: measured_us_by_op needs measured_us", 16, 7),
    ],
)
def test_bad_measured_tables_name_file_line_col_and_value(old, new, message, line, col, machine_error):
    assert load_machine_text(PROFILED, "tiny.yaml").collective_profiles  # the unchanged text loads
    assert old in PROFILED
    machine_error(PROFILED.replace(old, new, 1), "tiny.yaml", message, line, col)


def test_missing_top_level_key_lists_what_is_needed():
    with pytest.raises(MachineError, match="the machine is missing 'transports'"):
        load_machine_text(GOOD.split("transports:")[0], "tiny.yaml")


def test_string_that_looks_like_a_number_gets_a_hint():
    with pytest.raises(MachineError) as info:
        load_machine_text(GOOD.replace("sm_count: 8", "sm_count: 8").replace("comm_launch_us: 10", "comm_launch_us: 1e1"), "t.yaml")
    assert "1.0e+12" in info.value.hint


def test_invalid_yaml_and_empty_file():
    with pytest.raises(MachineError, match="invalid YAML"):
        load_machine_text("devices: [1,\n", "bad.yaml")
    with pytest.raises(MachineError, match="empty"):
        load_machine_text("", "empty.yaml")


def test_unknown_preset_is_a_usage_error_listing_presets(tmp_path):
    with pytest.raises(UsageError, match="no such machine file or preset: h200-fantasy") as info:
        resolve_machine("h200-fantasy")
    assert "h100-nvlink" in info.value.hint
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    assert resolve_machine(str(path)).name == "tiny"


def test_cli_machine_flag(tmp_path, capsys):
    assert main(["simulate", "1f1b", "--machine", "nope"]) == 2
    assert "no such machine file or preset: nope" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("sm_count: 8", "sm_count: -1"))
    assert main(["simulate", "1f1b", "--machine", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine error: device.sm_count must be at least 1, got -1")
    assert f"{bad}:7:13" in err
    assert main(["simulate", "1f1b", "--machine", "a100-nvlink", "--json"]) == 0
    assert '"machine": "a100-nvlink"' in capsys.readouterr().out


def test_measured_copy_profiles_time_copies_and_byte_sized_compute():
    """With `copy_measured_us`, copies follow the measured profile (log-log between
    points); without, the host link and the memory bandwidth."""
    from commdsl.dsl import load_schedule_text
    from commdsl.sim import simulate

    sched = load_schedule_text("name: t\nworld: 1\nstreams: [s]\nprogram: |\n  copy h 4MiB from host on s\n"
                               "  copy d 4MiB on s\n  compute c bytes=8MiB on s\n", "t.yaml")  # fmt: skip

    def durations(machine):
        r = simulate(sched, machine)
        return [r.raw.end[g] - r.raw.start[g] for g in range(3)]

    plain = load_machine_text(GOOD, "m.yaml")
    assert durations(plain) == pytest.approx([1 + 4 * 2**20 / 25e3, 2 * 4 * 2**20 / 100e3, 2 * 4 * 2**20 / 100e3])
    profiled = load_machine_text(GOOD + "copy_measured_us:\n  host: [[1048576, 100], [16777216, 1600]]\n"
                                 "  device: [[1048576, 50], [16777216, 800]]\n", "m.yaml")  # fmt: skip
    # 4 MiB is halfway (in log) between 1 and 16 MiB: sqrt(100 * 1600) = 400, sqrt(50 * 800) = 200;
    # compute moving 8 MiB is a copy of 4 MiB.
    assert durations(profiled) == pytest.approx([400, 200, 200])
    assert profiled.to_json()["copy_measured_us"]["host"] == [[1048576, 100], [16777216, 1600]]
    with pytest.raises(MachineError, match="copy_measured_us: unknown key 'pcie'"):
        load_machine_text(GOOD + "copy_measured_us: {pcie: [[1, 2], [3, 4]]}\n", "m.yaml")
    with pytest.raises(MachineError, match="copy_measured_us.host must be a list of at least two"):
        load_machine_text(GOOD + "copy_measured_us: {host: [[1, 2]]}\n", "m.yaml")



def test_interference_by_op_reads_and_wins_over_the_machine_wide_factors():
    from commdsl.ir import OpKind
    from commdsl.machine.model import OpInterference

    text = GOOD + "comm_compute_slowdown: 1.2\ncompute_comm_slowdown: 2.0\n" + BY_OP
    text += "  all_gather:\n    any: {comm_compute_slowdown: 1.4, compute_comm_slowdown: 1.0}\n"
    m = load_machine_text(text, "tiny.yaml")
    assert m.interference(OpKind.REDUCE_SCATTER, Dtype.BF16) == OpInterference(1.9, 1.3)
    assert m.interference(OpKind.REDUCE_SCATTER, Dtype.FP32) == OpInterference(1.2, 2.0)  # not listed: machine-wide
    assert m.interference(OpKind.ALL_GATHER, Dtype.FP16) == OpInterference(1.4, 1.0)  # any dtype
    assert m.to_json()["interference_by_op"] == {
        "reduce_scatter": {"bf16": {"comm_compute_slowdown": 1.9, "compute_comm_slowdown": 1.3}},
        "all_gather": {"any": {"comm_compute_slowdown": 1.4, "compute_comm_slowdown": 1.0}},
    }
    assert m.contention.slows_compute() and m.slows_comm()
    # Per-op factors alone switch interference on.
    only = load_machine_text(GOOD + BY_OP, "tiny.yaml")
    assert only.contention.slows_compute() and only.slows_comm() and only.contention.comm_compute_slowdown is None


def test_a_calibration_record_reads_and_round_trips():
    m = load_machine_text(GOOD + "calibration: {by: commdsl calibrate, date: '2026-11-24T00:00:00Z', source: host1, quick: true}\n", "m.yaml")
    assert m.calibration is not None and m.calibration.quick and m.calibration.source == "host1"
    assert m.to_json()["calibration"]["by"] == "commdsl calibrate"
    assert load_machine_text(GOOD, "m.yaml").calibration is None
    with pytest.raises(MachineError, match="calibration is missing 'source'"):
        load_machine_text(GOOD + "calibration: {by: me, date: today}\n", "m.yaml")
    with pytest.raises(MachineError, match="calibration.quick must be true or false, got 'maybe'"):
        load_machine_text(GOOD + "calibration: {by: me, date: today, source: x, quick: maybe}\n", "m.yaml")
