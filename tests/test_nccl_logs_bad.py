"""nccl-tests logs that cannot be read (issue 43 points 1 and 2): a table per class, each
row a `LogError` (or a usage error) naming the file and the line, never a traceback or a
hang; every number is checked where it is read, against commdsl.limits."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from commdsl.calibrate.nccl_logs import ALGO_NAMES, Given, parse_given, parse_logs, parse_nccl_list, read_logs
from commdsl.calibrate.nccl_tests import Run, bench_machine, choice
from commdsl.errors import CommdslError, LogError, UsageError
from commdsl.ir import Algo, OpKind, Protocol
from commdsl.limits import MAX_WORLD_SIZE
from commdsl.machine import resolve_machine
from commdsl.machine.nccl import NCCL_ALGOS

HEADER = """# nccl-tests version 2.17.9 nccl-headers=22602 nccl-library=22602
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4000 on      node0 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   4000 on      node0 device  1 [0000:19:00] NVIDIA H100 80GB HBM3
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
"""
ROW = "        1024           256     float     sum      -1    10.00    0.10    0.10       0    10.00    0.10    0.10       0\n"
END = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.1\n#\n# Collective test concluded: all_reduce_perf\n"
GOOD = HEADER + ROW + END
UNNAMED = HEADER.split("\n", 2)[2]
"""The header without the lines that name the tool (nccl-tests before 2.13, no command echoed)."""
BIG = "1" + "0" * 5000
SHORT = HEADER.replace("maxBytes 1024", "maxBytes 4096")
"""HEADER of a sweep to 4096 bytes: a run of ROW alone stops short of it."""


def _row(old: str, new: str) -> str:
    return HEADER + ROW.replace(old, new, 1) + END


def _info(line: str) -> str:
    """GOOD with an NCCL INFO line after the rank lines (line 8)."""
    return HEADER.replace("#\n#       size", f"node0:4000:4000 [0] NCCL INFO {line}\n#\n#       size", 1) + ROW + END


def _unchecked(row: str) -> str:
    """A row of a run with nccl-tests' data check off (`-c 0`): #wrong N/A out of place and in place."""
    return row.replace("       0", "     N/A")


OLD_GATHER = """# nThread 1 nGpus 2 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  12979 on    node0 device  0 [0x45] Tesla V100-SXM2-16GB
#   Rank  1 Pid  12979 on    node0 device  1 [0xc4] Tesla V100-SXM2-16GB
#
#                                             out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
"""An all_gather_perf run of nccl-tests before 2.13 on 2 GPUs, naming no tool (each rank's count is half the size)."""


def _old_gather_row(size: int, time: float, algbw: float) -> str:
    times = f"  {time:7.2f}  {algbw:6.2f}  {algbw:6.2f}  0e+00"
    return f"{size:12d}  {size // 8:12d}  {'float':>6}" + times * 2 + "\n"


def _bw(busbw: str, size: int = 1024) -> str:
    """ROW at algbw 1.00 GB/s and the given busbw, its time made to agree (nccl-tests prints algbw = size / time)."""
    return ROW.replace("1024 ", f"{size} ").replace("10.00    0.10    0.10", f"{size / 1e3:5.2f}    1.00    {busbw}")


# (name, text, line, column or None, message)
STRUCTURE = [
    ("another tool", "---\nRDMA_Write BW Test\n #bytes  #iterations  BW peak[Gb/sec]\n 65536  5000  97.5\n", 1, None, "not nccl-tests output"),
    ("cut mid-line", HEADER + ROW + "        2048           512     float     sum      -1    10.5", 12, 1, "cut-off result line"),
    # (a run without its summary whose last row is the end of its sweep is whole: test_nccl_logs_shapes.py)
    ("no summary", SHORT + ROW, 11, None, "truncated: the run of line 3"),
    ("no summary, a step short of maxBytes", HEADER.replace("maxBytes 1024", "maxBytes 2048") + ROW, 11, None,
     "truncated: the run of line 3 ends at line 11 without nccl-tests' closing `# Avg bus bandwidth` summary (its last row is of "
     "size 1024; its header's sweep goes on to 2048)"),
    ("no results", HEADER, 10, None, "no results"),
    # (each run cut off: the first's error; a file's other runs are read where they can be, see below)
    ("a run cut off before the next", SHORT + ROW + SHORT.split("\n", 1)[1] + ROW, 13, None, "run of line 3 has no closing"),
    ("rank listed twice", HEADER.replace("#  Rank  1 Group", "#  Rank  0 Group") + ROW + END, 7, None, "rank 0 is listed twice"),
    ("mixed GPU counts", HEADER.replace("#  Rank  1 Group  0 Pid   4000", "#  Rank  1 Group  0 Pid   4001").replace("nGpus 2", "nGpus 1")
     .replace("#\n#       size", "#  Rank  2 Group  0 Pid   4001 on      node0 device  2 [0000:1a:00] NVIDIA H100 80GB HBM3\n#\n#       size")
     + ROW + END, 3, None, "processes drive different numbers of GPUs"),
    ("hosts with different GPU counts", HEADER.replace("nGpus 2", "nGpus 1").replace("Pid   4000 on      node0 device  1", "Pid   4001 on      node1 device  0")
     .replace("#\n#       size", "#  Rank  2 Group  0 Pid   4002 on      node1 device  1 [0000:1a:00] NVIDIA H100 80GB HBM3\n#\n#       size")
     + ROW + END, 3, None, "the hosts run different numbers of GPUs"),
    ("ranks not a multiple", HEADER.replace("nGpus 2", "nGpus 4") + ROW + END, 3, None, "not a multiple of nGpus 4"),
    ("missing ranks", HEADER.replace("Rank  1 Group", "Rank  3 Group") + ROW + END, 3, None, "ranks [1, 2] are missing"),
    ("unknown type", _row("float", "quad"), 11, 32, "type 'quad'"),
    ("time not a number", _row("10.00    0.10", "oops    0.10"), 11, 57, "time 'oops' is not a number"),
    ("unknown tool", HEADER.replace("all_reduce_perf", "hypercube_perf", 1) + ROW + END, 2, None, "hypercube_perf"),
    ("mixed GPUs", HEADER.replace("device  1 [0000:19:00] NVIDIA H100 80GB HBM3", "device  1 [0000:19:00] NVIDIA A100-SXM4-80GB") + ROW + END,
     3, None, "mixes GPUs"),
    ("summary without results", HEADER + END, 12, None, "closing summary with no results"),
    ("titles without a time", HEADER.replace("  time", "  tiem") + ROW + END, 9, None, "without `time` and `type`"),
    ("no rank lines", "".join(line + "\n" for line in HEADER.splitlines() if "Rank" not in line) + ROW + END, 3, None, "no `# Rank N"),
    # (with the data checked, the in-place #wrong tells them: a count, or N/A for alltoall and sendrecv)
    ("no tool named, the columns fit two", UNNAMED + _unchecked(_bw("0.50").replace("sum", "none")) + END, 1, None,
     "its columns fit all_gather_perf or alltoall_perf"),
    ("no tool named, 2 GPUs: all_reduce or sendrecv", UNNAMED + _unchecked(_bw("1.00")) + END, 1, None,
     "its columns fit all_reduce_perf or sendrecv_perf"),
    ("no tool named, the columns fit none", UNNAMED + _bw("3.00") + END, 1, None,
     "no command naming it)"),
    # nccl-tests built without MPI support under mpirun: every process runs alone and lists itself as rank 0.
    ("copies of a 1-GPU test", HEADER.replace("nGpus 2", "nGpus 1").replace("#  Rank  1 Group  0 Pid   4000 on      node0 device  1",
                                                                         "#  Rank  0 Group  0 Pid   4001 on      node0 device  1")
     + ROW + END, 7, None, "rank 0 is listed by two processes (pid 4000 on node0, pid 4001 on node0): each ran its own test on 1 GPU"),
    # A grep of several logs' rows: the table ends at the text between them, and the second says nothing of its GPUs.
    # (where NCCL's INFO line says the first's GPUs, the first is read: test_a_table_that_does_not_say_its_gpus_...)
    ("rows of two runs without their headers", "$ grep -E 'nodes|1024 ' sweep.log\n== 1 node ==\n"
     + _bw("1.50") + "== 2 nodes ==\n" + _bw("1.75"), 3, None,
     "a result table without nccl-tests' header (line 3): the log does not say which tool wrote it or how many GPUs ran it"),
    # Fuzz of issue 43: rows inside a table that were read past as text, or read wrong.
    ("a size twice", HEADER + ROW + ROW + END, 12, 9, "size 1024 is listed twice in the run: first at line 11"),
    ("an unknown type", _row("float", " foo "), 11, 33, "type 'foo' is not one nccl-tests prints"),
    ("an unknown redop", _row("sum", "add"), 11, 42, "redop 'add' is not one nccl-tests prints (sum, prod, max, min, avg, mulsum, none)"),
    ("every row failed the data check", _row("0.10       0    10.00    0.10    0.10       0", "0.10       5    10.00    0.10    0.10       5"), 11,
     1, "every result of the run of line 3 failed nccl-tests' data check (#wrong above 0): nothing to fit"),
    ("nranks against the rank lines", _info("comm 0x5f00 rank 0 nranks 4 cudaDev 0 busId 18000 - Init COMPLETE"), 3, None,
     "the run lists 2 ranks, and NCCL's INFO lines say its communicator has 4 (nranks 4)"),
    # Two processes given one GPU (mpirun without a GPU binding): the second rank line names the same host, device and bus.
    ("two ranks on one GPU", HEADER.replace("Pid   4000 on      node0 device  1 [0000:19:00]", "Pid   4001 on      node0 device  0 [0000:18:00]")
     .replace("nGpus 2", "nGpus 1") + ROW + END, 7, None,
     "ranks 0 and 1 run on one GPU (device 0 [0000:18:00] of host node0; rank 0 at line 6): the timings are of ranks sharing a GPU, "
     "not of a GPU each"),
    # nccl-tests before mid-2020 printed all_gather's algbw as (size - count x type size) / time; a table of both is mangled.
    ("algbw of two formulas", OLD_GATHER + _old_gather_row(1048576, 40.0, 26.21) + _old_gather_row(2097152, 60.0, 17.48) + END, 11, 39,
     "time 60.00 us and algbw 17.48 GB/s agree with algbw = (size - count x type size) / time, where the rows above have algbw = "
     "size / time"),
]  # fmt: skip

NUMBERS = [
    ("size of 5,000 digits", _row("        1024", BIG), 11, 1, "size 100000000000... (5001 characters) is out of range"),
    ("count of 5,000 digits", _row("256", BIG), 11, 24, "count 100000000000... (5001 characters) is out of range"),
    ("negative size", _row("        1024", "       -1024"), 11, 8, "size -1024 is out of range: it must be from 0 to 1125899906842624"),
    ("size past 1 PiB", _row("        1024", "1125899906842625"), 11, 1, "size 1125899906842625 is out of range"),
    ("fractional size", _row("        1024", "      1024.5"), 11, 7, "size '1024.5' is not a whole number"),
    ("time inf", _row("10.00    0.10", "inf    0.10"), 11, 57, "time inf us: times are positive finite numbers"),
    ("time nan", _row("10.00    0.10", "nan    0.10"), 11, 57, "time nan us"),
    ("time 1e300", _row("10.00    0.10", "1e300    0.10"), 11, 57, "time 1e300 us is above the limit of 1e+09 us"),
    ("time negative", _row("10.00    0.10", "-3.0    0.10"), 11, 57, "time -3.0 us"),
    ("time zero", _row("10.00    0.10", "0.00    0.10"), 11, 57, "time 0.00 us"),
    ("time of 5,000 digits", _row("10.00    0.10", BIG + "    0.10"), 11, 57, "time 100000000000... (5001 characters) us: times are positive"),
    # Fuzz of issue 43: a row that does not start with a size is a row all the same; float() reads more than nccl-tests prints.
    ("size 1.024e3", _row("        1024", "     1.024e3"), 11, 6, "size '1.024e3' is not a whole number"),
    ("size nan", _row("        1024", "         nan"), 11, 10, "size 'nan' is not a whole number"),
    ("size 0x400", _row("        1024", "       0x400"), 11, 8, "size '0x400' is not a whole number"),
    ("size 1_024", _row("        1024", "       1_024"), 11, 8, "size '1_024' is not a whole number"),
    ("size N/A", _row("        1024", "         N/A"), 11, 10, "size 'N/A' is not a whole number"),
    ("size +1024", _row("        1024", "       +1024"), 11, 8, "size '+1024' is not a whole number"),
    ("size with a NUL byte", _row("        1024", "        10\x0024"), 11, 9, "size '10\\x0024' is not a whole number"),
    ("count nan", _row("256", "nan"), 11, 24, "count 'nan' is not a whole number"),
    ("root ab", _row("-1", "ab"), 11, 51, "root 'ab' is not a whole number"),
    ("time 1e-300", _row("10.00    0.10", "1e-300    0.10"), 11, 57, "time '1e-300' is not a time as nccl-tests prints it"),
    ("time 1_0.00", _row("10.00    0.10", "1_0.00    0.10"), 11, 57, "time '1_0.00' is not a time as nccl-tests prints it"),
    ("time +10.00", _row("10.00    0.10", "+10.00    0.10"), 11, 57, "time '+10.00' is not a time as nccl-tests prints it"),
    ("time in Arabic-Indic digits", _row("10.00    0.10", "\u0661\u0660.\u0660\u0660    0.10"), 11, 57,
     "time '\u0661\u0660.\u0660\u0660' is not a time as nccl-tests prints it"),
    ("time against its algbw", _row("10.00    0.10", "0.01    0.10"), 11, 57,
     "time 0.01 us and algbw 0.10 GB/s disagree: 1024 B in 0.01 us is 102.4 GB/s"),
    ("algbw abc", _row("10.00    0.10", "10.00     abc"), 11, 67, "algbw 'abc' is not a bandwidth as nccl-tests prints it"),
    ("algbw -1", _row("10.00    0.10", "10.00   -1.00"), 11, 65, "algbw '-1.00' is not a bandwidth"),
    ("busbw nan", _row("0.10    0.10", "0.10     nan"), 11, 75, "busbw 'nan' is not a bandwidth"),
    ("#wrong nan", _row("0.10       0", "0.10     nan"), 11, 83, "#wrong 'nan' is not a count of wrong elements as nccl-tests prints it"),
    ("#wrong -1", _row("0.10       0", "0.10      -1"), 11, 84, "#wrong '-1' is not a count of wrong elements"),
    ("0 coll channels", _info("0 coll channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer"), 8, 31,
     "coll channels 0 is out of range: it must be from 1 to 128"),
    ("99999999999 p2p channels", _info("24 coll channels, 0 nvls channels, 99999999999 p2p channels, 32 p2p channels per peer"), 8, 66,
     "p2p channels 99999999999 is out of range"),
    ("nGpus 0", HEADER.replace("nGpus 2", "nGpus 0") + ROW + END, 3, 19, "nGpus 0 is out of range: it must be from 1 to 65536"),
    ("nThread 0", HEADER.replace("nThread 1", "nThread 0") + ROW + END, 3, 11, "nThread 0 is out of range"),
    ("nGpus of 5,000 digits", HEADER.replace("nGpus 2", f"nGpus {BIG}") + ROW + END, 3, 19, "nGpus 100000000000... (5001 characters) is out of range"),
    ("nGpus not a number", HEADER.replace("nGpus 2", "nGpus two") + ROW + END, 3, 19, "nGpus 'two' is not a whole number"),
    ("rank 10^11", HEADER.replace("Rank  1 Group", "Rank 100000000000 Group") + ROW + END, 7, 9, "rank 100000000000 is out of range: it must be from 0 to 65535"),
    ("rank of 5,000 digits", HEADER.replace("Rank  1 Group", f"Rank {BIG} Group") + ROW + END, 7, 9, "rank 100000000000... (5001 characters)"),
    ("device 10^30", HEADER.replace("device  1 [", f"device {10**30} ["), 7, 53, "device 100000000000... (31 characters) is out of range: it must be from 0 to 65536"),
    ("graph of 5,000 digits", HEADER.replace("graph: 0", f"graph: {BIG}") + ROW + END, 3, 122, "graph 100000000000... (5001 characters)"),
]  # fmt: skip


@pytest.mark.parametrize("name,text,line,column,message", STRUCTURE + NUMBERS, ids=[r[0] for r in STRUCTURE + NUMBERS])
def test_bad_logs_are_errors_naming_the_line(name, text, line, column, message):
    with pytest.raises(LogError) as info:
        parse_logs(text, "bad.log")
    assert message in info.value.message
    loc = info.value.loc
    assert loc is not None and loc.file == "bad.log" and loc.line == line, loc
    if column is not None:
        assert loc.column == column, loc
    assert "Traceback" not in info.value.format()


def test_a_world_past_the_limit_is_refused_at_its_rank_line():
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {r:6d} on      n{r // 8:05d} device  {r % 8} [0000:18:00] NVIDIA H100 80GB HBM3\n"
                    for r in range(70_000))  # fmt: skip
    text = HEADER.replace("nGpus 2", "nGpus 1").split("#  Rank", 1)[0] + ranks + ROW + END
    with pytest.raises(LogError) as info:
        parse_logs(text, "huge.log")
    assert info.value.loc.file == "huge.log" and info.value.loc.line == 6 + MAX_WORLD_SIZE
    assert f"rank {MAX_WORLD_SIZE} is out of range" in info.value.message


GIVEN = [
    ("all_reduce_perf:0=x.log", "the GPU count after 'all_reduce_perf:' must be a whole number from 1 to 65536, got '0'"),
    ("all_reduce_perf:eight=x.log", "got 'eight'"),
    (f"all_reduce_perf:{BIG}=x.log", "must be a whole number"),
    ("all_reduce_perf:70000=x.log", "got '70000'"),
    ("all_reduce_perf:\uff18=x.log", "got '\uff18'"),  # a full-width 8
]


@pytest.mark.parametrize("arg,message", GIVEN, ids=[g[0][:30] for g in GIVEN])
def test_bad_given_values_are_usage_errors(arg, message):
    with pytest.raises(UsageError) as info:
        parse_given(arg)
    assert message in info.value.message


def test_given_values_must_agree_with_the_log(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(GOOD)
    with pytest.raises(LogError, match="the log is all_reduce_perf's, not all_gather_perf's") as info:
        read_logs([f"all_gather_perf={log}"])
    assert info.value.loc.line == 2
    unnamed = tmp_path / "b.log"
    unnamed.write_text(UNNAMED + _unchecked(_bw("1.00", 4096)) + END)  # 2 GPUs: 2(n-1)/n = 1; -c 0
    with pytest.raises(LogError, match=r"the run of line 1 is not all_gather_perf's, as the command line says: its redop is sum, and "
                                       r"all_gather_perf does not reduce \(it prints none\); its columns fit all_reduce_perf or "
                                       r"sendrecv_perf$") as info:  # fmt: skip
        read_logs([f"all_gather_perf={unnamed}"])
    assert info.value.loc.line == 1 and info.value.hint == f"name the tool that wrote it, e.g. all_reduce_perf={unnamed}"
    (taken,) = read_logs([f"sendrecv_perf={unnamed}"])  # a tool its columns fit is taken as given
    assert taken.tool == "sendrecv_perf"
    with pytest.raises(LogError, match="the run has 2 GPUs, not 4 as the command line says"):
        read_logs([f"all_reduce_perf:4={log}"])
    (weird := tmp_path / "a=b.log").write_text(GOOD)  # a file name with "=" that names no tool
    assert read_logs([str(weird)])[0].ranks == 2


def test_a_table_that_does_not_say_its_gpus_beside_other_runs_is_asked_to_be_cut_out_or_passed_alone():
    # A README's grep of several logs after whole runs: a GPU count given with the file would be every run's. The whole
    # run is read, the table skipped and told, with what to do.
    text = GOOD + "$ grep 1024 sweep.log\n" + ROW
    notes: list[str] = []
    assert [log.line for log in parse_logs(text, "readme.md", notes=notes)] == [3]
    assert notes == ["skipped readme.md:17: a run refused at line 17: a result table without nccl-tests' header (line 17): the log "
                     "does not say which tool wrote it or how many GPUs ran it; the file has 2 runs: cut this table out, or save it "
                     "to a file of its own and pass that as TOOL:GPUS=TABLE (e.g. all_reduce_perf:8=table.txt)"]  # fmt: skip


def test_a_gpu_count_given_for_tables_without_headers_must_be_of_one_table_and_agree_with_nccl():
    rows = ROW + "== 2 nodes ==\n" + ROW
    with pytest.raises(LogError, match=r"2 result tables without a header or rank lines \(lines 1, 3\): the GPU count given \(8\)") as info:
        parse_logs(rows, "grep.log", Given("all_reduce_perf", 8))
    assert info.value.loc.line == 3 and "a file of its own" in info.value.hint
    said = ROW + "node0:7:7 [0] NCCL INFO comm 0x5f00 rank 0 nranks 4 cudaDev 0 busId 18000 - Destroy COMPLETE\n"
    with pytest.raises(LogError, match=r"the run has 4 GPUs \(NCCL's INFO lines: nranks 4\), not 8 as the command line says"):
        parse_logs(said, "said.log", Given("all_reduce_perf", 8))
    (log,) = parse_logs(said, "said.log", Given("all_reduce_perf", 4))
    assert (log.ranks, log.nodes) == (4, None)
    # One table of two types (`-d all`) is one table: the GPU count given is both blocks'.
    two_types = ROW + ROW.replace("   float", "    half").replace("256 ", "512 ")
    assert [(log.ranks, log.dtype.value) for log in parse_logs(two_types, "d.log", Given("all_reduce_perf", 8))] == [(8, "fp32"), (8, "fp16")]


def test_runs_on_one_gpu_are_skipped_and_a_log_of_only_those_is_refused(tmp_path):
    # A run on 1 GPU moves nothing between GPUs (its in-place reduce takes 0.2 us): nothing to fit, and the simulator has no
    # transfer to time.
    one = "".join(line + "\n" for line in HEADER.replace("nGpus 2", "nGpus 1").splitlines() if "Rank  1" not in line) + ROW + END
    (only := tmp_path / "one.log").write_text(one)
    with pytest.raises(LogError, match="every run of .*one.log is on 1 GPU: it moves no data between GPUs") as info:
        read_logs([str(only)])
    assert info.value.loc.line == 3
    (both := tmp_path / "both.log").write_text(one + GOOD)
    notes: list[str] = []
    assert [log.ranks for log in read_logs([str(both)], notes)] == [2]
    assert notes == [f"skipped {both}:3: all_reduce_perf on 1 GPU moves no data between GPUs"]


def _special_files(tmp_path) -> list[tuple[str, str]]:
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.log"
    loop.symlink_to(loop)
    (bad := tmp_path / "latin1.log").write_bytes(GOOD.encode().replace(b"node0", b"n\xe9ud0"))
    return [(str(fifo), "not a regular file"), (str(tmp_path), "not a regular file"), (str(loop), "cannot read nccl-tests log"),
            (str(tmp_path / "nope.log"), "no such file"), (str(bad), "not UTF-8 text")]  # fmt: skip


def test_files_that_are_not_logs_are_refused_without_blocking(tmp_path):
    for path, message in _special_files(tmp_path):
        with pytest.raises(CommdslError) as info:
            read_logs([path])
        assert message in info.value.message, (path, info.value.message)


def test_the_command_line_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--from-nccl-tests", str(fifo), "--out", str(tmp_path / "m.yaml")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot read nccl-tests log {fifo}: not a regular file" in r.stderr
    assert not (tmp_path / "m.yaml").exists()


def test_a_row_whose_data_check_failed_is_skipped_and_told():
    # #wrong above 0: nccl-tests found wrong elements, the time is of an op that went wrong. N/A: not checked (-c 0).
    second = ROW.replace("1024 ", "2048 ").replace("0.10    0.10", "0.20    0.20")
    text = HEADER + ROW.replace("0.10       0    10.00", "0.10      17    10.00", 1) + second.replace("       0\n", "     N/A\n") + END
    notes: list[str] = []
    (log,) = parse_logs(text, "wrong.log", notes=notes)
    assert [(p.size_bytes, p.line) for p in log.points] == [(2048, 12)]
    assert notes == ["wrong.log:11: the result of size 1024 skipped: nccl-tests found wrong elements (#wrong 17 out of place)"]


def test_the_sweeps_of_run_cycles_repeat_their_sizes():
    # `-N 2` times the sizes again from the first; a size twice within one sweep is an error (the table above).
    second = ROW.replace("1024 ", "2048 ").replace("0.10    0.10", "0.20    0.20")
    (log,) = parse_logs(HEADER + ROW + second + ROW + second + END, "cycles.log")
    assert [p.size_bytes for p in log.points] == [1024, 2048, 1024, 2048]
    with pytest.raises(LogError, match="size 2048 is listed twice in the run: first at line 12") as info:
        parse_logs(HEADER + ROW + second + second + END, "twice.log")
    assert info.value.loc.line == 13 and info.value.related[0][1].line == 12


def test_nccl_algo_names_commdsl_does_not_read_are_told():
    notes: list[str] = []
    (log,) = parse_logs(_info("NCCL_ALGO set by environment to bogus"), "algo.log", notes=notes)
    assert log.algos is None
    assert notes == ["algo.log:8: NCCL_ALGO bogus not read: 'bogus' is not one of its names (it takes tree, ring, collnetdirect, "
                     "collnetchain, nvls, nvlstree, pat); the run is simulated with NCCL's own choice"]  # fmt: skip
    notes.clear()
    (log,) = parse_logs(_info("NCCL_ALGO set by environment to PAT,Ring"), "pat.log", notes=notes)
    assert log.algos == frozenset({Algo.PAT, Algo.RING}) and notes == []
    (log,) = parse_logs(_info("NCCL_PROTO set by environment to Simple,^LL128."), "proto.log", notes=notes)
    assert log.protos is None
    assert notes == ["proto.log:8: NCCL_PROTO Simple,^LL128 not read: '^LL128' is not one of its names (it takes ll, ll128, "
                     "simple); the run is simulated with NCCL's own choice"]  # fmt: skip


ALL_ALGOS = frozenset(NCCL_ALGOS)
NCCL_LISTS = [
    # (NCCL_ALGO as set, what it enables for all_reduce, for all_gather); tuning.cc parseList's own examples among them
    ("Ring", {Algo.RING}, {Algo.RING}),
    ("ring,TREE", {Algo.RING, Algo.TREE}, {Algo.RING, Algo.TREE}),
    ("^NVLS", ALL_ALGOS - {Algo.NVLS}, ALL_ALGOS - {Algo.NVLS}),
    ("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", {Algo.TREE, Algo.COLLNET_DIRECT}, {Algo.RING, Algo.COLLNET_DIRECT}),
    ("allreduce:tree", {Algo.TREE}, ALL_ALGOS),
    ("AllGather:^ring;allreduce:nvlstree", {Algo.NVLS_TREE}, ALL_ALGOS - {Algo.RING}),
]


@pytest.mark.parametrize("value,all_reduce,all_gather", NCCL_LISTS)
def test_nccl_algo_is_read_as_nccl_reads_it(value, all_reduce, all_gather):
    lists = parse_nccl_list(value, ALGO_NAMES)
    assert lists[OpKind.ALL_REDUCE] == all_reduce and lists[OpKind.ALL_GATHER] == all_gather


@pytest.mark.parametrize("value,why", [
    ("tree;ring", "'ring' names no collective, as every entry after the first must"),
    ("alltoall:ring", "'alltoall' is no collective of NCCL's"),
    ("allreduce:tree,hypercube", "'hypercube' is not one of its names"),
])  # fmt: skip
def test_what_nccl_refuses_in_nccl_algo_is_named(value, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_nccl_list(value, ALGO_NAMES)


def test_a_runs_nccl_algo_is_its_collectives_own_and_leaves_nccl_to_choose_among_it():
    notes: list[str] = []
    (log,) = parse_logs(_info("NCCL_PROTO set by environment to ^LL128;allreduce:LL128"), "proto.log", notes=notes)
    assert log.protos == frozenset({Protocol.LL128}) and notes == []  # the log's run is an all_reduce
    (log,) = parse_logs(_info("NCCL_ALGO set by environment to allgather:ring"), "algo.log", notes=notes)
    assert log.algos is None  # all of NCCL's algorithms for all_reduce
    # ^Ring on two H100s: NCCL's choice among the rest (the tree), where it takes a ring
    (log,) = parse_logs(_info("NCCL_ALGO set by environment to ^Ring"), "algo.log", notes=notes)
    run = Run.of(log)
    h100 = resolve_machine("dgx-h100")
    assert run.algo is None and run.algos == ALL_ALGOS - {Algo.RING}
    assert choice(bench_machine(h100, run), run, 1 << 30).algo is Algo.TREE
    free = Run.of(parse_logs(_info("NCCL_ALGO set by environment to allgather:tree"), "free.log", notes=notes)[0])
    assert free.algos is None and choice(bench_machine(h100, free), free, 1 << 30).algo is Algo.RING


def test_mpirun_messages_inside_a_table_are_still_text():
    # Lines with the table's width that are not rows: few of their words are numbers.
    help_line = "[h:00017] 3 more processes have sent help message help-mpi-btl-openib.txt / no device params found\n"
    (log,) = parse_logs(HEADER + help_line + ROW + END, "mpi.log")
    assert [p.line for p in log.points] == [12]


def test_a_file_of_several_runs_asks_for_the_unnamed_run_on_its_own(tmp_path):
    # A tool named for the file would be every run's: the note says to save the one run apart; the other run is read.
    log = tmp_path / "two.log"
    log.write_text(GOOD + "\n" + UNNAMED + _unchecked(_bw("1.00")) + END)
    notes: list[str] = []
    assert [run.line for run in read_logs([str(log)], notes)] == [3]
    assert len(notes) == 1 and notes[0].startswith(f"skipped {log}:17: a run refused at line 17: cannot tell which nccl-tests tool")
    assert notes[0].endswith("save the run of line 17 to a file of its own and name it, e.g. all_reduce_perf=PART")
    # Every run of a file refused: the file is, with the first run's error.
    log.write_text(UNNAMED + _unchecked(_bw("1.00")) + END + "\n" + UNNAMED + _unchecked(_bw("1.00")) + END)
    with pytest.raises(LogError, match="cannot tell which nccl-tests tool wrote the run of line 1 ") as info:
        read_logs([str(log)])
    assert info.value.loc.line == 1


NAMED = [
    # (tool named, text, what the message names): the field that decided, not a ratio that fits.
    ("all_gather_perf", UNNAMED + _bw("0.50").replace("     sum", "        ") + END,  # a fork's blank redop (mccl-tests)
     "its redop is blank, as only alltoall_perf printed it (before nccl-tests 2.13); its columns fit no nccl-tests tool on 2 GPUs"),
    ("alltoall_perf", UNNAMED + _bw("0.50").replace("sum", "none") + END,
     "its in-place #wrong is a count (the results checked), and alltoall_perf never checks them (it prints N/A); its columns fit "
     "all_gather_perf"),
    ("all_reduce_perf", UNNAMED + _bw("0.50").replace("sum", "none") + END,
     "its redop is none, and all_reduce_perf reduces (it prints the reduction, e.g. sum); its columns fit all_gather_perf"),
    ("reduce_scatter_perf", UNNAMED + _bw("0.75") + END, "busbw / algbw is 0.75 (busbw 0.75, algbw 1), and reduce_scatter_perf's on 2 "
     "GPUs is 0.5; its columns fit no nccl-tests tool on 2 GPUs"),
]  # fmt: skip


@pytest.mark.parametrize("tool,text,message", NAMED, ids=[n[0] for n in NAMED])
def test_a_tool_named_against_the_columns_is_refused_naming_the_field_that_decided(tool, text, message):
    with pytest.raises(LogError) as info:
        parse_logs(text, "named.log", Given(tool))
    assert info.value.message == f"the run of line 1 is not {tool}'s, as the command line says: {message}"
    assert info.value.loc.line == 1


def test_without_the_data_checked_the_in_place_wrong_count_says_nothing_of_the_tool():
    # `validation: 0` (-c 0): some nccl-tests versions print 0 in both #wrong columns all the same.
    text = UNNAMED.replace("validation: 1", "validation: 0") + _bw("0.50").replace("sum", "none") + END
    (log,) = parse_logs(text, "c0.log", Given("alltoall_perf"))
    assert log.tool == "alltoall_perf"
    with pytest.raises(LogError, match=r"its columns fit all_gather_perf or alltoall_perf\)"):
        parse_logs(text, "c0.log")


def test_a_partial_rank_list_under_nccl_tests_header_reads_with_the_gpu_count_given():
    # nccl-tests lists every rank: with ranks missing the log was abridged; the count given is the run's.
    text = HEADER.replace("Rank  1 Group", "Rank  3 Group").replace("nGpus 2", "nGpus 1") + ROW + END
    with pytest.raises(LogError, match=r"ranks \[1, 2\] are missing") as info:
        parse_logs(text, "abridged.log")
    assert info.value.hint == "if the log was abridged, give the run's GPU count: TOOL:GPUS=FILE, e.g. all_reduce_perf:4=abridged.log"
    notes: list[str] = []
    (log,) = parse_logs(text, "abridged.log", Given("all_reduce_perf", 4), notes)
    assert (log.ranks, log.gpus_per_process, log.nodes, log.device) == (4, 1, None, "NVIDIA H100 80GB HBM3")
    assert notes == ["abridged.log:3: the rank list names only ranks 0, 3: read as 4 GPUs, as the command line gives, the nodes not said"]


def test_a_header_whose_rank_lines_were_cut_reads_with_the_gpu_count_given(tmp_path):
    log = tmp_path / "cut.log"
    log.write_text("\n".join(line for line in GOOD.split("\n") if "Rank" not in line))
    with pytest.raises(LogError, match="no `# Rank N ... on HOST device D` lines") as info:
        read_logs([str(log)])
    assert f"all_reduce_perf:8={log}" in info.value.hint
    (taken,) = read_logs([f"all_reduce_perf:2={log}"])
    assert (taken.tool, taken.ranks, taken.nodes) == ("all_reduce_perf", 2, None)
