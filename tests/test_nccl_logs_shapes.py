"""nccl-tests logs as users save them (issue 39 point 1): one fixture per shape in
tests/data/nccl_logs (written for these tests in nccl-tests' and NCCL's formats), each read
and checked for what it says: the tool, the GPU count and layout, the type, NCCL's version,
NCCL_ALGO / NCCL_PROTO and channel counts where the INFO lines give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from commdsl.calibrate.nccl_logs import Channels, Given, _command_gpus, _last_sizes, _tool_name, parse_logs, read_logs
from commdsl.calibrate.nccl_tests import DEVICE_PRESETS, Run, bench_machine, choice, from_nccl_tests
from commdsl.errors import LogError
from commdsl.ir import Algo, Dtype, OpKind, Protocol
from commdsl.machine import resolve_machine

DATA = Path(__file__).parent / "data" / "nccl_logs"
H100 = "NVIDIA H100 80GB HBM3"

# file (with what the command line adds), then per run: (line of the run, tool, ranks, GPUs per
# thread, nodes, graph, dtype, device, algos, protos, NCCL version, channels, points, first size, its time, its in-place time)
SHAPES = [
    ("echo_banners_no_tool_line.log",
     [(5, "all_reduce_perf", 8, 8, 1, False, Dtype.FP32, H100, None, None, None, None, 25, 8, 30.0, 30.3)]),
    ("markdown_fenced.md",
     [(8, "all_gather_perf", 8, 1, 1, False, Dtype.FP32, H100, None, None, "2.26.2", None, 21, 1024, 12.0, 12.12)]),
    ("nccl_info_interleaved.log",
     [(7, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, H100, {Algo.TREE}, {Protocol.SIMPLE}, "2.23.4", Channels(24, 0, 32, 32),
       19, 1024, 45.02, 45.47)]),
    ("srun_label_prefix.log",
     [(3, "reduce_scatter_perf", 8, 1, 1, False, Dtype.BF16, "NVIDIA A100-SXM4-80GB", None, None, "2.26.2", None, 16, 2048, 15.01, 15.16)]),
    ("sweep_ops.log",
     [(3, "all_reduce_perf", 16, 1, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 6, 33554432, 1458.1, 1472.68),
      (40, "all_gather_perf", 16, 1, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 6, 33554432, 759.05, 766.64),
      (77, "alltoall_perf", 16, 1, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 6, 33554432, 759.05, 766.64),
      (114, "sendrecv_perf", 16, 1, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 6, 33554432, 805.65, 813.71),
      (151, "broadcast_perf", 16, 1, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 6, 33554432, 805.65, 813.71)]),
    ("sweep_gpu_counts.log",
     [(5, "all_reduce_perf", 2, 2, 1, False, Dtype.FP32, H100, None, None, "2.18.5", None, 25, 8, 14.0, 14.14),
      (46, "all_reduce_perf", 4, 4, 1, False, Dtype.FP32, H100, None, None, "2.18.5", None, 25, 8, 18.0, 18.18),
      (89, "all_reduce_perf", 8, 8, 1, False, Dtype.FP32, H100, None, None, "2.18.5", None, 25, 8, 26.0, 26.26)]),
    ("all_reduce_perf:8=headerless_table.txt",
     [(3, "all_reduce_perf", 8, 1, None, False, Dtype.FP32, "", None, None, None, None, 11, 1048576, 35.79, 36.15)]),
    ("all_reduce_perf=old_format_no_root.log",
     [(1, "all_reduce_perf", 8, 8, 1, False, Dtype.FP32, "Tesla V100-SXM2-32GB", None, None, None, None, 24, 8, 18.0, 18.18)]),
    # The same log without the tool's name: its columns say it (redop sum, busbw = 1.75 x algbw on 8 GPUs).
    ("old_format_no_root.log",
     [(1, "all_reduce_perf", 8, 8, 1, False, Dtype.FP32, "Tesla V100-SXM2-32GB", None, None, None, None, 24, 8, 18.0, 18.18)]),
    ("sharp_collnet_snipped.md",
     [(11, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, "NVIDIA A100-SXM4-80GB", None, None, None, None, 6, 1048576, 61.3, 61.5)]),
    ("kubectl_launcher_no_tool.md",
     [(5, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, "NVIDIA A100-SXM4-80GB", None, None, "2.18.3", None, 4, 1073741824, 11671.0, 11683.0)]),
    ("per_iteration_graph_threads.log",
     [(3, "all_gather_perf", 16, 4, 2, True, Dtype.FP32, "NVIDIA H200", None, None, "2.28.3", None, 13, 65536, 30.38, 30.69)]),
    ("sweep_with_failed_run.log",
     [(3, "alltoall_perf", 8, 4, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 4, 33554432, 814.0, 822.14),
      (51, "all_reduce_perf", 8, 4, 2, False, Dtype.FP64, H100, None, None, "2.26.2", None, 4, 33554432, 1548.01, 1563.49)]),
    ("mpirun_tag_output.log",
     [(2, "broadcast_perf", 8, 1, 1, False, Dtype.FP16, H100, None, None, None, None, 22, 8, 9.0, 9.09)]),
    # Tables pasted under the command that ran them, without header or rank lines: the command says the GPUs
    # (`-g 4` alone; `mpirun -np 2` continued over lines, `-g 1`).
    ("command_gpus_headerless.md",
     [(6, "reduce_scatter_perf", 4, 4, None, False, Dtype.BF16, "", None, None, None, None, 4, 67108864, 402.5, 405.0),
      (19, "all_reduce_perf", 2, 1, None, False, Dtype.FP32, "", None, None, None, None, 2, 1073741824, 48210.0, 48250.0)]),
    # A sweep in nccl-tests' columns of before 2.13, naming no tool: all_gather's titles have neither redop nor root,
    # broadcast's root alone, alltoall's a redop printed blank; with busbw / algbw each fits one tool.
    ("old_format_per_tool_columns.log",
     [(2, "all_gather_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-16GB", None, None, None, None, 5, 262144, 21.5, 21.9),
      (22, "broadcast_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-16GB", None, None, None, None, 5, 262144, 18.25, 18.55),
      (42, "alltoall_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-16GB", None, None, None, None, 5, 262144, 24.0, 24.5)]),
    # `-d all` then `-o all`: a block of rows per type (uint32 and uint64, no commdsl dtype, read as int32 and int64) and
    # per reduction, each read as a run of its own.
    ("several_types_and_reductions.log",
     [(line, "all_reduce_perf", 2, 2, 1, False, dtype, "NVIDIA GeForce RTX 4090", None, None, "2.24.2", None, 3, 1048576, t, t + 1.5)
      for line, dtype, t in [(4, Dtype.INT8, 161.5), (16, Dtype.UINT8, 162.25), (19, Dtype.INT32, 163.0), (22, Dtype.INT32, 163.75),
                             (25, Dtype.INT64, 164.5), (28, Dtype.INT64, 165.25), (31, Dtype.FP16, 166.0), (34, Dtype.FP32, 166.75),
                             (37, Dtype.FP64, 167.5), (40, Dtype.BF16, 168.25)]]
     + [(line, "all_reduce_perf", 2, 2, 1, False, Dtype.FP32, "NVIDIA GeForce RTX 4090", None, None, "2.24.2", None, 3, 1048576, t,
         t + 1.25) for line, t in [(51, 161.5), (63, 162.0), (66, 162.5), (69, 163.0), (72, 163.5)]]),
    # nccl-tests 2.19's `-S 1`: a timestamp column (date and time, two words) after the in-place columns.
    ("timestamp_column_two_nodes.log",
     [(3, "alltoall_perf", 8, 4, 2, False, Dtype.FP32, "NVIDIA H200", None, None, "2.30.1", None, 4, 16777216, 170.5, 171.25)]),
    # `kubectl logs --timestamps`: a timestamp before every line, mpirun's help-message lines inside the table.
    ("logger_timestamp_prefix.log",
     [(4, "all_reduce_perf", 4, 1, 2, False, Dtype.FP16, H100, None, None, "2.27.5", None, 4, 1048576, 71.25, 72.0)]),
    # Pasted into markdown without a code fence: nccl-tests' `# nThread`, `# Rank`, titles and summary lost their `#`.
    ("markdown_lost_hashes.md",
     [(7, "all_gather_perf", 4, 1, 2, False, Dtype.FP32, "NVIDIA A100-SXM4-80GB", None, None, None, None, 4, 1048576, 61.5, 62.12)]),
    # rccl-tests cut above its rank list (no header; rank lines with no device name): the ranks give the GPUs and nodes,
    # `RCCL version : 2.25.1-HEAD:...` the version.
    ("rccl_snipped_rank_lines.md",
     [(19, "all_reduce_perf", 8, 1, 2, False, Dtype.FP32, "", None, None, "2.25.1", None, 7, 65536, 48.0, 48.5)]),
    # A table without header or rank lines: NCCL's INFO line (`comm 0x... rank 0 nranks 16`) gives the GPU count.
    ("headerless_nccl_info_nranks.md",
     [(7, "all_reduce_perf", 16, 1, None, False, Dtype.FP32, "", None, None, None, None, 6, 1048576, 92.4, 93.4)]),
    # nccl-tests 2.13's header (no `# Collective test starting:`) under a RHEL shell prompt `[root@host dir]# mpirun ...`
    # in `~~~` fences: the echoed command names the tool; the second with -c 0 (no data check).
    ("rhel_prompt_tildes.md",
     [(5, "all_reduce_perf", 2, 1, 2, False, Dtype.FP32, "NVIDIA L40S", None, None, None, None, 4, 1048576, 95.0, 95.95),
      (27, "sendrecv_perf", 4, 2, 2, False, Dtype.FP32, "NVIDIA L40S", None, None, None, None, 4, 1048576, 120.0, 121.2)]),
    # A run that hung after NCCL's init (stopped with ^C) between two whole runs: the next command names the next run's
    # tool, and that run, printing no version, has none (not the hung one's NCCL version).
    ("hung_run_then_rerun.log",
     [(4, "all_reduce_perf", 2, 2, 1, False, Dtype.FP32, H100, None, None, "2.19.3", None, 4, 1048576, 20.0, 20.2),
      (34, "all_reduce_perf", 2, 2, 1, False, Dtype.FP32, H100, None, None, None, None, 4, 1048576, 21.0, 21.21)]),
    # No tool named: all_gather and alltoall print the same columns (redop none, busbw = (n-1)/n x algbw), but alltoall never
    # checks its in-place results (#wrong N/A) where all_gather does.
    ("inplace_wrong_tells_the_tool.log",
     [(1, "all_gather_perf", 16, 1, 2, False, Dtype.FP32, H100, None, None, None, None, 4, 16777216, 420.0, 424.2),
      (32, "alltoall_perf", 16, 1, 2, False, Dtype.FP32, H100, None, None, None, None, 4, 16777216, 450.0, 454.5)]),
    # `export NCCL_ALGO=RING` / `NCCL_PROTO=Simple` in the shell lines above the runs; `unset NCCL_PROTO` before the second.
    ("export_algo_before_table.md",
     [(12, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, H100, {Algo.RING}, {Protocol.SIMPLE}, "2.29.2", None, 3, 1073741824, 5900.0,
       5959.0),
      (54, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, H100, {Algo.RING}, None, "2.29.2", None, 3, 1073741824, 5850.0, 5908.5)]),
    # mpirun --tag-output repeats its tag inside a row, which nccl-tests prints in three writes.
    ("mpirun_tag_output_split_rows.log",
     [(2, "all_reduce_perf", 16, 1, 2, False, Dtype.FP32, H100, None, None, "2.22.3", None, 4, 8388608, 120.0, 122.4)]),
    # Rank lines with the host names taken out (no `on HOST`): one process drives the eight GPUs, so one node.
    ("rank_lines_without_hosts.md",
     [(6, "all_reduce_perf", 8, 8, 1, False, Dtype.FP32, "NVIDIA B200", None, None, "2.27.5", None, 3, 1048576, 30.0, 30.3)]),
    # A table pasted without nccl-tests' closing summary, its last row the last size of the header's sweep (-b 8M -e 100M
    # -f 2 stops at 64M): a whole run.
    ("complete_table_no_summary.md",
     [(10, "all_reduce_perf", 4, 4, 1, False, Dtype.FP32, "NVIDIA GeForce RTX 4090", None, None, "2.26.2", None, 4, 8388608, 602.5, 608.52)]),
    # nccl-tests of 2019: all_gather and reduce_scatter print algbw = busbw = (size - count x type size) / time; the
    # reduce_scatter, not named, is told by that algbw (busbw = algbw) and its redop.
    ("old_format_gather_scatter_algbw.log",
     [(3, "all_reduce_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-32GB", None, None, None, None, 4, 1048576, 38.5, 38.9),
      (23, "all_gather_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-32GB", None, None, None, None, 4, 1048576, 30.5, 30.8),
      (43, "reduce_scatter_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-32GB", None, None, None, None, 4, 1048576, 33.25, 33.55)]),
    # `-d all` with `Reducing maxBytes`: uint32 read as int32, f8e5m2 as fp8 (the same element size), each a run of its own.
    ("dtype_all_unsigned_e5m2.log",
     [(line, "all_reduce_perf", 8, 8, 1, False, dtype, "NVIDIA H200", None, None, "2.30.4", None, 2, 1073741824, t, t + 4.5)
      for line, dtype, t in [(4, Dtype.INT32, 4650.5), (24, Dtype.INT32, 4652.25), (26, Dtype.FP8, 5760.0), (28, Dtype.FP8, 5758.75)]]),
    # rccl-tests with NCCL_DEBUG=VERSION: `RCCL version : 2.22.3-develop:...` is the version (RCCL's track NCCL's).
    ("rccl_version_block.log",
     [(2, "all_reduce_perf", 8, 1, 1, False, Dtype.FP32, "AMD Instinct MI300X", None, None, "2.22.3", None, 3, 268435456, 1561.25, 1573.75)]),
    # Markdown took every `#` out; `validation: 0` (-c 0) with 0 in both #wrong columns: no evidence of the in-place check,
    # so the tool named (alltoall, whose busbw / algbw is all_gather's) stands.
    ("alltoall_perf:16=no_hashes_validation_off.md",
     [(5, "alltoall_perf", 16, 1, None, False, Dtype.FP32, "", None, None, None, None, 4, 8388608, 790.5, 781.0)]),
    # A patched nccl-tests: `graph: 0, parallel_init:0` in the header, its own `AllReduceRunColl` line inside the table.
    ("patched_header_parallel_init.log",
     [(1, "all_reduce_perf", 4, 4, 1, False, Dtype.FP32, "Tesla V100-SXM2-16GB", None, None, None, None, 3, 268435456, 55810.0, 55822.0)]),
    # A wrapper's own header (`# nGpus(perProc)`) and rank lines of ranks 7 and 15 only: the GPU count given is the run's.
    ("all_reduce_perf:16=wrapper_header_partial_ranks.log",
     [(10, "all_reduce_perf", 16, 1, None, False, Dtype.BF16, "NVIDIA H200", None, None, "2.27.7", None, 3, 268435456, 3105.5, 3167.61)]),
]  # fmt: skip


def _arg(spec: str) -> str:
    given, eq, name = spec.rpartition("=")
    return f"{given}={DATA / name}" if eq else str(DATA / name)


def test_a_log_that_does_not_name_its_tool_is_read_from_its_columns_and_says_so():
    notes: list[str] = []
    (log,) = read_logs([str(DATA / "kubectl_launcher_no_tool.md")], notes)
    assert log.tool == "all_reduce_perf"
    assert notes == [f"{DATA / 'kubectl_launcher_no_tool.md'}:5: the log does not name its tool; read as all_reduce_perf from its "
                     "columns (redop sum, in-place results checked, busbw = 1.875 x algbw on 16 GPUs)"]  # fmt: skip


def test_collnet_is_taken_from_the_command_that_enabled_it_and_the_run_is_simulated_with_it():
    logs = {spec.rpartition("=")[2]: read_logs([_arg(spec)]) for spec, _ in SHAPES}
    said = {name: {log.collnet for log in runs} for name, runs in logs.items()}
    assert said.pop("sharp_collnet_snipped.md") == {True}  # `-x NCCL_COLLNET_ENABLE=1` in the echoed mpirun
    assert all(values == {None} for values in said.values()), said  # "N collnet channels" is NCCL's ring count, not CollNet
    (log,) = logs["sharp_collnet_snipped.md"]
    run = Run.of(log)
    m = resolve_machine("dgx-a100")
    assert run.collnet is True and not m.nccl.collnet and bench_machine(m, run).nccl.collnet
    assert choice(bench_machine(m, run), run, 32 << 20).algo is Algo.COLLNET_DIRECT


def test_an_info_line_turning_collnet_off_is_taken_for_its_run():
    text = (DATA / "sharp_collnet_snipped.md").read_text().replace(
        "--(snip)--", "gpu001:5100:5100 [0] NCCL INFO NCCL_COLLNET_ENABLE set by environment to 0.")
    (log,) = parse_logs(text, "off.md")
    assert log.collnet is False


def test_every_fixture_is_in_the_table():
    named = {spec.rpartition("=")[2] for spec, _ in SHAPES}
    assert named == {p.name for p in DATA.iterdir()}


@pytest.mark.parametrize("spec,runs", SHAPES, ids=[s for s, _ in SHAPES])
def test_each_shape_reads_as_the_runs_it_records(spec, runs):
    logs = read_logs([_arg(spec)])
    assert len(logs) == len(runs)
    path = str(DATA / spec.rpartition("=")[2])
    for log, want in zip(logs, runs):
        line, tool, ranks, per_thread, nodes, graph, dtype, device, algos, protos, version, channels, n, size, t, t_in = want
        assert log.path == (path if len(runs) == 1 else f"{path}:{line}") and log.line == line
        assert (log.tool, log.ranks, log.gpus_per_process, log.nodes, log.graph) == (tool, ranks, per_thread, nodes, graph)
        assert log.ranks_per_node == (ranks // nodes if nodes else None)
        assert (log.dtype, log.device, log.nccl_version, log.channels) == (dtype, device, version, channels)
        assert log.algos == (frozenset(algos) if algos else None) and log.protos == (frozenset(protos) if protos else None)
        assert len(log.points) == n and (log.points[0].size_bytes, log.points[0].time_us, log.points[0].in_place_us) == (size, t, t_in)
        assert all(b.size_bytes == 2 * a.size_bytes for a, b in zip(log.points, log.points[1:]))


def test_the_run_of_a_log_carries_its_layout_and_channels():
    (log,) = read_logs([str(DATA / "nccl_info_interleaved.log")])
    run = Run.of(log)
    assert (run.op, run.ranks, run.ranks_per_node, run.algos, run.protos, run.channels) == (
        OpKind.ALL_REDUCE, 16, 8, {Algo.TREE}, {Protocol.SIMPLE}, Channels(24, 0, 32, 32))


@pytest.mark.parametrize("spec,hint", [("headerless_table.txt", "all_reduce_perf:8="), ("all_reduce_perf=headerless_table.txt", ":GPUS=FILE")])
def test_what_a_log_does_not_say_is_asked_for_with_the_line(spec, hint):
    with pytest.raises(LogError) as info:
        read_logs([_arg(spec)])
    assert hint in info.value.hint and info.value.loc.line == 3


def test_a_log_too_small_to_show_its_bus_factor_is_asked_for_its_tool(tmp_path):
    # Up to 8 KiB every algbw is below 0.5 GB/s: two decimals say nothing of busbw / algbw.
    lines = (DATA / "old_format_no_root.log").read_text().split("\n")
    small = tmp_path / "small.log"
    small.write_text("\n".join(line for line in lines if not (line.split() and line.split()[0].isdigit() and int(line.split()[0]) > 8192)))
    with pytest.raises(LogError) as info:
        read_logs([str(small)])
    # Titles of before nccl-tests 2.13 with `redop` and no `root`: all_reduce's, reduce_scatter's or alltoall's, and the
    # redop `sum` is not alltoall's (blank).
    assert info.value.message.endswith("its columns fit all_reduce_perf or reduce_scatter_perf)")
    assert f"all_reduce_perf={small}" in info.value.hint and info.value.loc.line == 1


@pytest.mark.parametrize("tool,first", [("all_gather_perf", 13), ("broadcast_perf", 33), ("alltoall_perf", 53)])
def test_rows_of_the_old_columns_pasted_without_titles_read_their_times(tmp_path, tool, first):
    # A row says its columns: the words between `type` and the eight timing columns are a redop (a word) or a root (a
    # number); old alltoall's blank redop leaves a row like all_gather's.
    lines = (DATA / "old_format_per_tool_columns.log").read_text().split("\n")
    rows = tmp_path / "rows.txt"
    rows.write_text("\n".join(lines[first - 1 : first + 4]) + "\n")
    (log,) = read_logs([f"{tool}:4={rows}"])
    want = {p.size_bytes: (p.time_us, p.in_place_us) for p in read_logs([str(DATA / "old_format_per_tool_columns.log")])[
        ["all_gather_perf", "broadcast_perf", "alltoall_perf"].index(tool)].points}
    assert {p.size_bytes: (p.time_us, p.in_place_us) for p in log.points} == want


COMMANDS = [
    ("./build/sendrecv_perf -b 128M -e 1G -f 2 -g 8", (8, 8)),
    ("root@box:~/nccl-tests# ./build/all_reduce_perf -b 8 -e 1024M -f 2 -g2", (2, 2)),
    ("$ NCCL_ALGO=Ring sudo all_gather_perf --ngpus=4 -t 2", (8, 4)),
    ("mpirun -n 4 --bind-to none ./all_reduce_perf -t 2 -g 2", (16, 2)),
    ("> mpirun -v --hostfile h -np 16 -npernode 8 -x VARS /opt/nccl-tests/build/all_reduce_perf -b 8 -g 1", (16, 1)),
    ("srun -n 16 --mpi=pmix all_reduce_perf_mpi -b 512M -g 1", (16, 1)),
    ("srun -N2 --gpus-per-node=4 all_reduce_perf -b 1M", None),  # the task count is Slurm's
    ("mpirun -np $NP ./all_reduce_perf -g 1", None),
    ("timeout 60 ./build/all_reduce_perf -g 8", None),  # another program before the tool
    ("kubectl exec pod -- /scripts/all_gather_perf -g 8", None),
    ("./build/all_reduce_perf -g 0", None),
    ("./build/all_reduce_perf -g 70000", None),
]  # fmt: skip


@pytest.mark.parametrize("command,want", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_an_echoed_command_says_its_gpus_where_it_can(command, want):
    words = command.split()
    k = next(k for k, w in enumerate(words) if _tool_name(w))
    assert _command_gpus(words, k) == want


@pytest.mark.parametrize("device,preset", [("A100-SXM4-40GB", "dgx-a100"), ("NVIDIA H200", "dgx-h200"), ("NVIDIA H800", "hgx-h800"),
                                           ("NVIDIA GeForce RTX 4090", "pcie-rtx4090"), ("NVIDIA GH200 120GB", "gh200-quad")])  # fmt: skip
def test_gpu_names_as_logs_print_them_choose_the_preset_of_that_gpu(device, preset):
    # Old drivers print "A100-SXM4-40GB" (Microsoft SuperBench's logs); each preset with an `nccl:` section is a base.
    machine = resolve_machine(DEVICE_PRESETS[device])
    assert machine.name == preset and machine.nccl is not None


def test_a_command_continued_over_lines_says_its_gpus_with_options_after_the_tool():
    rows = (DATA / "command_gpus_headerless.md").read_text().split("```")[3].split("\n", 4)[4]  # the all_reduce table, titled
    text = "mpirun -np 2 -H a:1,b:1 \\\n    ./build/all_reduce_perf \\\n    -b 1G -e 2G -f 2 -g 4\n" + rows
    notes: list[str] = []
    (log,) = parse_logs(text, "multi.md", notes=notes)
    assert (log.tool, log.ranks, log.gpus_per_process) == ("all_reduce_perf", 8, 4)
    assert "multi.md:5: a table without rank lines; read as 8 GPUs, as the command that ran it says" in notes


def test_a_failed_run_of_a_sweep_is_skipped_and_told():
    notes: list[str] = []
    logs = read_logs([str(DATA / "sweep_with_failed_run.log")], notes)
    assert [log.tool for log in logs] == ["alltoall_perf", "all_reduce_perf"]
    assert notes == [f"skipped {DATA / 'sweep_with_failed_run.log'}:30: sendrecv_perf ended before its first result "
                     "(cnode2-001: Test NCCL failure common.cu:401 'remote process exited or there was a network error / ')"]


def test_a_log_whose_only_run_failed_is_an_error_quoting_the_failure(tmp_path):
    text = (DATA / "sweep_with_failed_run.log").read_text().split("\n")
    only = tmp_path / "failed.log"
    only.write_text("\n".join(text[27:50]) + "\n")
    with pytest.raises(LogError) as info:
        read_logs([str(only)])
    assert "no results: the run of line 3 ends before its first result line: cnode2-001: Test NCCL failure" in info.value.message


@pytest.mark.parametrize("spec,runs", SHAPES, ids=[s for s, _ in SHAPES])
def test_each_shape_saved_with_windows_line_endings_reads_the_same(tmp_path, spec, runs):
    given, eq, name = spec.rpartition("=")
    saved = tmp_path / name
    saved.write_bytes((DATA / name).read_bytes().replace(b"\n", b"\r\n"))
    got = read_logs([f"{given}={saved}" if eq else str(saved)])
    want = read_logs([_arg(spec)])
    assert [(log.line, log.tool, log.ranks, log.nodes, log.points) for log in got] == [
        (log.line, log.tool, log.ranks, log.nodes, log.points) for log in want]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_log_saved_as_utf16_with_its_bom_reads_as_its_utf8_text(tmp_path, encoding):
    # Windows PowerShell's `>` saves a command's output as UTF-16 with a byte-order mark.
    text = (DATA / "kubectl_launcher_no_tool.md").read_text()
    saved = tmp_path / "ps.log"
    bom = b"" if encoding == "utf-16" else ("\ufeff".encode(encoding))
    saved.write_bytes(bom + text.encode(encoding))
    (log,) = read_logs([str(saved)])
    (want,) = read_logs([str(DATA / "kubectl_launcher_no_tool.md")])
    assert (log.tool, log.ranks, log.nodes, log.points) == (want.tool, want.ranks, want.nodes, want.points)


def test_bytes_that_only_start_like_utf16_are_an_error_at_the_first_byte_not_utf8(tmp_path):
    bad = tmp_path / "bad16.log"
    bad.write_bytes(b"\xff\xfeA")  # a BOM, then half a UTF-16 unit
    with pytest.raises(LogError, match="is not UTF-8 text: byte 0xff cannot be decoded") as info:
        read_logs([str(bad)])
    assert (info.value.loc.line, info.value.loc.column) == (1, 1) and info.value.hint == "save the file as UTF-8"


def test_busbw_and_algbw_each_rounded_to_two_decimals_still_tell_the_tool(tmp_path):
    # nccl-tests computes busbw from the unrounded algbw and prints both to two decimals: on 8
    # GPUs (all_reduce: 1.75) a row may print algbw 1.11 and busbw 1.93, 0.0125 from 1.75 x 1.11.
    text = (DATA / "old_format_no_root.log").read_text()
    row = "      131072         32768     float     sum    20.09    6.53   11.42   1e-07    20.29    6.46   11.31   1e-07"
    assert row in text
    rounded = tmp_path / "rounded.log"
    rounded.write_text(text.replace(row, "      131072         32768     float     sum   118.08    1.11    1.93   1e-07   118.10    1.11    1.93   1e-07"))
    notes: list[str] = []
    (log,) = read_logs([str(rounded)], notes)
    assert log.tool == "all_reduce_perf" and "read as all_reduce_perf from its columns" in notes[0]


def test_rows_of_size_zero_are_skipped_and_told(tmp_path):
    text = (DATA / "sweep_ops.log").read_text().split("\n")
    k = next(i for i, line in enumerate(text) if line.strip().startswith("33554432"))
    zero = "           0             0    double     sum      -1    30.00    0.00    0.00       0    30.00    0.00    0.00       0"
    (tmp_path / "zero.log").write_text("\n".join(text[:k] + [zero] + text[k:]))
    notes: list[str] = []
    logs = read_logs([str(tmp_path / "zero.log")], notes)
    assert len(logs[0].points) == 6 and logs[0].points[0].size_bytes == 33554432
    assert any("1 row(s) of size 0 skipped (they move no data)" in n for n in notes)


def test_a_table_without_its_summary_is_whole_where_its_last_row_ends_its_sweep(tmp_path):
    # A paste that stops after the table (GitHub issues, READMEs): -b 8M -e 100M -f 2 times 8M to 64M, and 64M is there.
    notes: list[str] = []
    (log,) = read_logs([str(DATA / "complete_table_no_summary.md")], notes)
    assert log.points[-1].size_bytes == 67108864
    assert notes == [f"{DATA / 'complete_table_no_summary.md'}:10: no closing `# Avg bus bandwidth` summary after the run's last row "
                     "(line 24), but that row's size 67108864 is the last of the sweep its header sets (maxBytes 104857600): read "
                     "as a whole run"]  # fmt: skip
    # One row fewer: the run stopped short of its sweep, cut off, as before.
    lines = (DATA / "complete_table_no_summary.md").read_text().split("\n")
    (cut := tmp_path / "cut.md").write_text("\n".join(line for line in lines if not line.lstrip().startswith("67108864")))
    with pytest.raises(LogError, match=r"truncated: the run of line 10 ends at line 23 without nccl-tests' closing `# Avg bus "
                                       r"bandwidth` summary \(its last row is of size 33554432; its header's sweep goes on to "
                                       r"67108864\)"):  # fmt: skip
        read_logs([str(cut)])


def test_reducing_maxbytes_for_memory_ends_the_sweep_where_nccl_tests_says(tmp_path):
    text = (DATA / "dtype_all_unsigned_e5m2.log").read_text()
    table = text.split("# Out of bounds")[0]  # cut after its last row, as pasted
    (cut := tmp_path / "cut.log").write_text(table)
    assert [log.line for log in read_logs([str(cut)])] == [4, 24, 26, 28]  # 2G: the last size below the 3G nccl-tests lowered it to
    # Without that line the sweep goes on to 8G: the last type's block is cut off, told; the types before it are whole.
    (short := tmp_path / "short.log").write_text(table.replace("# Reducing maxBytes to 3221225472 due to memory limitation\n", ""))
    notes: list[str] = []
    assert [log.line for log in read_logs([str(short)], notes)] == [4, 23, 25]
    assert (f"skipped {short}:27: the all_reduce_perf run refused at line 28: truncated: the run of line 27 ends at line 28 without "
            "nccl-tests' closing `# Avg bus bandwidth` summary (its last row is of size 2147483648; its header's sweep goes on to "
            "8589934592); the run did not finish; rerun it, or cut the log after its last whole line and add the summary") in notes


@pytest.mark.parametrize("sweep,last", [
    ((8, 134217728, 2, True), (67108864, 134217728)),
    ((8388608, 104857600, 2, True), (33554432, 67108864)),
    ((1048576, 104857600, 4, True), (16777216, 67108864)),
    ((1024, 5000, 1024, False), (3072, 4096)),
    ((64, 64, 2, True), (0, 64)),
    ((8, 4, 2, True), None),  # minBytes above maxBytes
    ((8, 64, 0, False), None),  # a step of 0 bytes would not end
])  # fmt: skip
def test_the_last_sizes_of_a_sweep_are_nccl_tests_own(sweep, last):
    assert _last_sizes(sweep) == last


def test_a_run_that_cannot_be_read_is_skipped_and_told_and_the_files_other_runs_are_read(tmp_path):
    text = (DATA / "old_format_gather_scatter_algbw.log").read_text()
    row = "     4194304        262144   float    68.50   45.92   45.92  0e+00    68.80   45.72   45.72  0e+00"
    assert row in text
    (sweep := tmp_path / "sweep.log").write_text(text.replace(row, row.replace("68.50   45.92", "68.50   99.99")))
    notes: list[str] = []
    assert [log.tool for log in read_logs([str(sweep)], notes)] == ["all_reduce_perf", "reduce_scatter_perf"]
    assert notes[-1] == (f"skipped {sweep}:23: the all_gather_perf run refused at line 36: time 68.50 us and algbw 99.99 GB/s disagree: "
                        "4194304 B in 68.50 us is 61.23 GB/s (nccl-tests prints algbw = size / time, or 3145728 B (the size less one "
                        "rank's part) as all_gather and reduce_scatter printed it before mid-2020); the row is mangled; rerun the "
                        "test or drop the line")  # fmt: skip
    # The same run alone is refused with that error.
    (alone := tmp_path / "alone.log").write_text("\n".join(sweep.read_text().split("\n")[22:42]))
    with pytest.raises(LogError, match="time 68.50 us and algbw 99.99 GB/s disagree") as info:
        read_logs([str(alone)])
    assert info.value.loc.line == 14


def test_types_without_a_dtype_of_their_own_are_read_as_their_element_size_and_told():
    notes: list[str] = []
    logs = read_logs([str(DATA / "dtype_all_unsigned_e5m2.log")], notes)
    assert [log.dtype for log in logs] == [Dtype.INT32, Dtype.INT32, Dtype.FP8, Dtype.FP8]
    path = DATA / "dtype_all_unsigned_e5m2.log"
    assert notes[1:] == [f"{path}:24: rows of type uint32 read as int32, its element size (commdsl has no uint32; an op's time is of its "
                         "bytes and reduction)",
                         f"{path}:28: rows of type f8e5m2 read as fp8, its element size (commdsl has no f8e5m2; an op's time is of its "
                         "bytes and reduction)"]  # fmt: skip


def test_rccls_version_is_read_and_told_as_rccls():
    notes: list[str] = []
    (log,) = read_logs([str(DATA / "rccl_version_block.log")], notes)
    assert log.nccl_version == "2.22.3"
    assert notes == [f"{DATA / 'rccl_version_block.log'}:14: RCCL 2.22.3 (rccl-tests, AMD GPUs): read as the NCCL version it tracks"]


def test_without_the_data_checked_the_in_place_wrong_column_does_not_tell_alltoall_from_all_gather():
    # `validation: 0`, and this version printed 0 in both #wrong columns: all_gather and alltoall fit alike.
    (log,) = read_logs([f"all_gather_perf:16={DATA / 'no_hashes_validation_off.md'}"])
    assert log.tool == "all_gather_perf"
    with pytest.raises(LogError, match=r"cannot tell which nccl-tests tool .*; its columns fit all_gather_perf or alltoall_perf\)"):
        parse_logs((DATA / "no_hashes_validation_off.md").read_text(), "n.md", Given(None, 16))


def test_a_partial_rank_list_is_read_with_the_gpu_count_given_or_the_highest_rank(tmp_path):
    path = DATA / "wrapper_header_partial_ranks.log"
    notes: list[str] = []
    (log,) = read_logs([str(path)], notes)  # no count given: ranks 7 and 15 of 16
    assert (log.tool, log.ranks, log.nodes, log.device) == ("all_reduce_perf", 16, None, "NVIDIA H200")
    assert notes[0] == f"{path}:10: the rank list names only ranks 7, 15: read as 16 GPUs, as the highest rank listed + 1, the nodes not said"
    with pytest.raises(LogError, match="rank 15 is listed, and the run has 8 GPUs as the command line gives") as info:
        read_logs([f"all_reduce_perf:8={path}"])
    assert info.value.hint == f"give the run's GPU count: TOOL:GPUS=FILE, e.g. all_reduce_perf:16={path}"
    # The count given overrides what the rank lines imply: on 24 GPUs busbw / algbw is not all_reduce's.
    with pytest.raises(LogError, match=r"busbw / algbw is 1.875 \(busbw 162.07, algbw 86.44\), and all_reduce_perf's on 24 GPUs is 1.917"):
        read_logs([f"all_reduce_perf:24={path}"])


def test_a_machine_fitted_to_one_file_of_several_runs_says_one_file(tmp_path):
    out = tmp_path / "m.yaml"
    from_nccl_tests([str(DATA / "dtype_all_unsigned_e5m2.log")], str(out), echo=lambda _: None)
    assert out.read_text().startswith("# Written by `commdsl calibrate --from-nccl-tests` from 1 nccl-tests log(s):\n")
