"""A table of known bad inputs and the exact error each must produce.

Every row is a small schedule (or a -p override, or command-line arguments) with the
expected error class, a substring of its message, and the file line and column the
error must point at: lines in the YAML file, never in the `program:` block. Rows marked
`cli` also run through the real command line (`python -m commdsl.cli check FILE`), which
must exit 1 (schedule error) or 2 (usage error) with a one-screen message and no traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import CommdslError, DeadlockError, LimitError, ScheduleError, UsageError, ValidationError

# The program of a `prog(...)` case starts on file line P + 1, indented by two spaces:
# program line k is file line P + k, and program column c is file column c + 2.
HEAD = """\
# a bad-input case
name: t
params:
  n: 4
  t_fwd: 2ms
world: 4
streams: [compute, comm]
groups:
  pairs: [[0, 1], [2, 3]]
  low: [0, 1]
program: |
"""
P = 11
assert HEAD.count("\n") == P


def prog(*lines: str) -> str:
    return HEAD + "".join(f"  {line}\n" if line else "\n" for line in lines)


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    message: str
    line: int | None
    column: int | None
    error: type[CommdslError] = ScheduleError
    cli: bool = False
    """Also run this row through `python -m commdsl.cli check`."""
    hint: str | None = None
    related_line: int | None = None
    """A second source line the message must show (cross-rank errors)."""
    overrides: dict[str, str] = field(default_factory=dict)
    max_ops: int | None = None
    rank: int | None = None


CASES = [
    # ---- syntax ---------------------------------------------------------------------
    Case("missing_colon", prog("if rank > 0", "    compute F 1ms"), "unexpected end of line; expected ':'", P + 1, 14, cli=True),
    Case("unexpected_indent", prog("compute F 1ms", "    compute G 1ms"), "unexpected indentation", P + 2, 7,
         hint="indentation only follows a line that ends with ':'"),
    Case("dedent_to_no_block", prog("for i in range(3):", "    compute F 1ms", "  compute G 1ms"),
         "indentation matches no enclosing block", P + 3, 5),
    Case("missing_block", prog("if rank > 0:", "compute F 1ms"), f"expected an indented block after the ':' on line {P + 1}",
         P + 2, 3),
    Case("tab_indent", prog("if rank > 0:", "\tcompute F 1ms"), "tab character in indentation", P + 2, 3, cli=True),
    Case("unclosed_paren", prog("x = 1", "compute F (t_fwd * 2"), "'(' is never closed", P + 2, 13, hint="add the matching ')'"),
    Case("unclosed_bracket", prog("compute F[rank t_fwd"), "unexpected 't_fwd'", P + 1, 18),
    Case("unit_with_space", prog("all_reduce g 32 MiB"), "a space separates 32 from its unit MiB", P + 1, 19,
         hint="32MiB", cli=True),
    Case("unknown_unit", prog("compute F 2mss"), "unknown unit 'mss' in '2mss'", P + 1, 14),
    Case("stray_character", prog("compute F 1ms $"), "unexpected character '$'", P + 1, 17),
    Case("operator_typo", prog("x = 2 +* 3"), "unexpected '*'; expected an expression", P + 1, 10),
    Case("missing_expression", prog("x ="), "unexpected end of line; expected", P + 1, 6),
    Case("keyword_as_name", prog("send = 3"), "unexpected '='", P + 1, 8),
    # ---- names ----------------------------------------------------------------------
    Case("unknown_name", prog("compute F t_fwdd"), "unknown name 't_fwdd'", P + 1, 13, hint="did you mean 't_fwd'?",
         cli=True, rank=0),
    Case("unknown_block", prog("def forward(mb):", "    compute F[mb] t_fwd", "forwrd(0)"), "unknown block 'forwrd'",
         P + 3, 3, hint="did you mean 'forward'?"),
    Case("unknown_function", prog("x = maxx(1, 2)"), "unknown function 'maxx'", P + 1, 7, hint="did you mean 'max'?"),
    Case("unknown_option", prog("compute F 1ms flop=1GFLOP"), "compute has no option 'flop'", P + 1, 17,
         hint="did you mean 'flops'?"),
    Case("option_twice", prog("all_reduce g 4MiB op=sum op=max"), "option 'op' given twice", P + 1, 28),
    Case("unknown_enum_value", prog("all_reduce g 4MiB op=summ"), "unknown op 'summ'; expected one of sum, avg", P + 1, 21,
         hint="did you mean 'sum'?", cli=True),
    Case("unknown_group", prog("all_reduce g 4MiB group=pair"), "unknown group 'pair'", P + 1, 21, hint="did you mean 'pairs'?"),
    Case("unknown_group_attr", prog("x = pipe.rank"), "unknown group 'pipe'", P + 1, 7),
    Case("unknown_stream", prog("compute F 1ms on comms"), "unknown stream 'comms'", P + 1, 20, hint="did you mean 'comm'?"),
    Case("unknown_stream_block", prog("on comms:", "    compute F 1ms"), "unknown stream 'comms'", P + 1, 6),
    Case("device_op_on_host", prog("compute F 1ms on host"), "runs on a device stream, not on the host", P + 1, 20),
    Case("assign_to_param", prog("n = 3"), "cannot assign to 'n': it is a param", P + 1, 3),
    Case("assign_to_rank", prog("rank = 3"), "cannot bind 'rank': it is reserved", P + 1, 3),
    Case("loop_over_rank", prog("for rank in range(2):", "    pass"), "cannot bind 'rank'", P + 1, 7),
    Case("internal_name", prog("__ctx__ = 1", "x = world.size"), "cannot bind '__ctx__'", P + 1, 3),
    Case("read_internal_name", prog("compute F __ctx__"), "unknown name '__ctx__'", P + 1, 13),
    # ---- point-to-point -------------------------------------------------------------------
    Case("isend_without_handle", prog("isend x 4MiB to (rank + 1) % 4"), "isend returns a handle; bind it", P + 1, 3, rank=0),
    Case("send_with_from", prog("send x 4MiB from 1"), "send names its peer with 'to', not 'from'", P + 1, 15),
    Case("recv_with_to", prog("recv x 4MiB to 1"), "recv names its peer with 'from', not 'to'", P + 1, 15),
    Case("handle_on_blocking_send", prog("h = send x 4MiB to (rank + 1) % 4"), "send is synchronous and returns no handle",
         P + 1, 7),
    Case("peer_out_of_range", prog("send x 4MiB to rank + 4"), "peer 4 is out of range: the world has ranks 0..3", P + 1, 18,
         cli=True, rank=0),
    Case("peer_not_integer", prog("send x 4MiB to rank + 0.5"), "peer must be an integer rank", P + 1, 18),
    Case("send_to_self", prog("send x 4MiB to rank"), "rank 0 cannot send to itself", P + 1, 18, rank=0),
    Case("peer_not_in_group", prog("send x 4MiB to 3 - rank group=pairs"), "peer 3 is not in group pairs[0]", P + 1, 18),
    # ---- collectives ----------------------------------------------------------------------
    Case("root_missing", prog("broadcast x 4MiB"), "broadcast needs its root: src=RANK", P + 1, 3),
    Case("root_out_of_range", prog("broadcast x 4MiB src=4"), "root 4 is out of range", P + 1, 24),
    Case("root_not_in_group", prog("broadcast x 4MiB src=3 group=pairs"), "root 3 is not in group pairs[0]", P + 1, 24),
    Case("wrong_root_option", prog("reduce x 4MiB src=0"), "reduce has no option 'src'", P + 1, 17),
    Case("rank_not_member", prog("all_reduce g 4MiB group=low"), "rank 2 is not a member of group 'low'", P + 1, 3, rank=2),
    Case("size_not_splittable", prog("reduce_scatter x 8B"), "does not split into 4 equal chunks", P + 1, 20),
    Case("size_not_whole_elements", prog("all_reduce g 6B"), "not a multiple of the fp32 element size (4B)", P + 1, 16),
    Case("duration_where_size_goes", prog("all_reduce g 5ms"), "expected a size such as 32MiB", P + 1, 16, cli=True),
    Case("negative_size", prog("all_reduce g 0B - 4B"), "size must not be negative", P + 1, 16),
    # ---- values ------------------------------------------------------------------------------
    Case("duration_plus_size", prog("x = t_fwd + 1MiB"), "cannot compute a duration (2ms) + a size (1MiB)", P + 1, 7),
    Case("size_for_compute", prog("compute F 4MiB"), "compute takes a duration (2ms) or work (4GFLOP), got a size", P + 1, 13),
    Case("non_bool_condition", prog("if n:", "    pass"), "an if condition must be true or false, got an integer", P + 1, 6),
    Case("non_bool_elif", prog("if rank == 9:", "    pass", "elif n:", "    pass"), "must be true or false", P + 3, 8),
    Case("non_bool_and", prog("x = rank > 0 and n"), "an operand of 'and' must be true or false", P + 1, 7),
    Case("compare_units", prog("if t_fwd > 1MiB:", "    pass"), "cannot compare a duration (2ms) with a size (1MiB)", P + 1, 6),
    Case("division_by_zero", prog("x = n / (rank - rank)"), "division by zero", P + 1, 7),
    Case("integer_overflow", prog("x = 2 ** 64"), "integer result out of range", P + 1, 7),
    Case("float_overflow", prog("x = 1e300 * 1e300"), "arithmetic overflow", P + 1, 7),
    Case("log2_of_zero", prog("x = log2(rank)"), "log2() of 0", P + 1, 7),
    Case("dtype_count_not_int", prog("all_reduce g bf16[n / 3]"), "bf16[...] takes a non-negative element count", P + 1, 21),
    Case("assert_fails", prog('assert n % 3 == 0, "n must be a multiple of 3"'), "assertion failed: n must be a multiple of 3",
         P + 1, 10, cli=True),
    # ---- handles and events ------------------------------------------------------------------
    Case("handle_waited_twice", prog("h = all_reduce g 4MiB", "wait h", "wait h"),
         f"handle 'h' is waited twice (bound at line {P + 1})", P + 3, 3),
    Case("wait_before_bind", prog("wait h", "h = all_reduce g 4MiB"),
         f"handle 'h' is waited before the op that binds it (line {P + 2})", P + 1, 3),
    Case("event_waited_before_record", prog("wait e on comm", "record e"),
         f"event 'e' is waited before it is recorded (recorded at line {P + 2})", P + 1, 3),
    Case("event_never_recorded", prog("record ev", "wait e"), "wait on 'e': no handle or event of that name on rank 0",
         P + 2, 3, hint="known: ev"),
    Case("event_named_like_handle", prog("h = all_reduce g 4MiB", "record h", "wait h"), "'h' is already a handle", P + 2, 3),
    # ---- batches ----------------------------------------------------------------------------
    Case("nested_batch", prog("batch:", "    batch:", "        h = isend x 4MiB to (rank + 1) % 4"),
         "batch blocks cannot be nested", P + 2, 7),
    Case("compute_in_batch", prog("batch:", "    compute F 1ms"), "a batch holds isend/irecv only, not compute", P + 2, 7),
    Case("blocking_send_in_batch", prog("batch:", "    send x 4MiB to (rank + 1) % 4"),
         "a batch holds isend/irecv only, not send", P + 2, 7, hint="write isend"),
    Case("collective_in_batch", prog("batch:", "    all_reduce g 4MiB"), "a batch holds isend/irecv only, not all_reduce",
         P + 2, 7),
    Case("empty_batch", prog("batch:", "    pass"), "this batch issued no isend/irecv on this rank", P + 1, 3),
    # ---- blocks and limits ------------------------------------------------------------------
    Case("block_arg_count", prog("def f(a):", "    pass", "f(1, 2)"), "f() takes 1 argument(s) (a), got 2", P + 3, 3),
    Case("block_bad_keyword", prog("def f(a):", "    pass", "f(b=1)"), "unexpected or repeated argument 'b'", P + 3, 3),
    Case("block_repeated_param", prog("def f(a, a):", "    pass"), "block 'f' repeats a parameter name", P + 1, 3),
    Case("recursion_too_deep", prog("def f(a):", "    f(a)", "f(1)"), "blocks nest deeper than 64 calls", P + 2, 7),
    Case("range_float", prog("for i in range(1.5):", "    pass"), "range() takes integers, got a number", P + 1, 3),
    Case("range_step_zero", prog("for i in range(0, 4, 0):", "    pass"), "range() step must not be zero", P + 1, 3),
    Case("range_arity", prog("for i in range(1, 2, 3, 4):", "    pass"), "range() takes 1 to 3 integers", P + 1, 3),
    Case("past_max_ops", prog("for i in range(1000):", "    compute F[i] 1ms"), "expands to more than 100 ops", P + 2, 7,
         error=LimitError, max_ops=100, cli=True),
    Case("giant_loop", prog("for i in range(10**12):", "    compute F 1ms"),
         "this loop would run 1,000,000,000,000 iterations", P + 1, 3, error=LimitError),
    Case("giant_loop_past_ssize", prog("for i in range(2**62 * 3):", "    compute F 1ms"), "integer result out of range", P + 1, 18),
    Case("giant_loop_huge", prog("for i in range(-(2**62), 2**62):", "    compute F 1ms"), "iterations; expansion is limited",
         P + 1, 3, error=LimitError),
    # ---- cross-rank validation -------------------------------------------------------------
    Case("send_recv_count", prog("if rank == 0:", "    send x 4MiB to 1"),
         "rank 0 sends 1 message(s) to rank 1 on group world but rank 1 receives 0", P + 2, 7, error=ValidationError,
         cli=True, hint="add the missing recv on rank 1"),
    Case("send_recv_count_related", prog("if rank == 0:", "    send x 4MiB to 1", "    send y 4MiB to 1", "if rank == 1:",
                                         "    recv x 4MiB from 0"),
         "rank 0 sends 2 message(s) to rank 1 on group world but rank 1 receives 1", P + 3, 7, error=ValidationError,
         related_line=P + 5),
    Case("send_recv_size", prog("if rank == 0:", "    send x 4MiB to 1", "if rank == 1:", "    recv x 8MiB from 0"),
         "send #1 from rank 0 to rank 1 on group world is 4MiB but the matching recv is 8MiB", P + 2, 7,
         error=ValidationError, related_line=P + 4),
    Case("send_recv_group", prog("if rank == 0:", "    send x 4MiB to 1 group=pairs", "if rank == 1:", "    recv x 4MiB from 0"),
         "rank 0 sends 1 message(s) to rank 1 on group pairs[0] but rank 1 receives 0", P + 2, 7, error=ValidationError,
         hint="rank 1 receives on group world instead: a send and its recv must name the same group"),
    Case("collective_kind", prog("if rank == 0:", "    all_reduce g 4MiB", "else:", "    all_gather g 4MiB"),
         "collective #1 on group world differs between ranks (kind): rank 0 issues `all_reduce", P + 4, 7,
         error=ValidationError, related_line=P + 2, cli=True),
    Case("collective_size", prog("all_reduce g (rank + 1) * 4MiB"), "differs between ranks (size)", P + 1, 3,
         error=ValidationError, related_line=P + 1),
    Case("collective_root", prog("broadcast x 4MiB src=rank % 2"), "differs between ranks (root)", P + 1, 3,
         error=ValidationError, rank=1),
    Case("collective_op", prog("if rank < 2:", "    all_reduce g 4MiB op=max", "else:", "    all_reduce g 4MiB op=min"),
         "differs between ranks (reduce op): rank 0 issues `all_reduce g 4MiB fp32 op=max` but rank 2 issues", P + 4, 7,
         error=ValidationError, related_line=P + 2, rank=2),
    Case("collective_count", prog("if rank != 3:", "    all_reduce g 4MiB"),
         "rank 0 issues 1 collective(s) on group world but rank 3 issues 0", P + 2, 7, error=ValidationError),
    # ---- YAML and the schedule's keys -----------------------------------------------------------
    Case("yaml_syntax", "name: t\nworld: 4\nparams: {a: [1, 2}\nprogram: |\n  pass\n", "invalid YAML", 3, 18, cli=True),
    Case("yaml_bad_indent", "name: t\nworld: 4\nprogram: |\n  pass\n streams: [a]\n", "invalid YAML", 5, 2),
    Case("yaml_control_char", "name: t\nworld: 4\x01\nprogram: |\n  pass\n", "unacceptable character", 2, 9),
    Case("yaml_bad_tag", "name: t\nworld: !!int four\nprogram: |\n  pass\n", "invalid YAML value", 2, 8),
    Case("duplicate_key", "world: 4\nworld: 3\nprogram: |\n  pass\n", "key 'world' appears twice (first at line 1)", 2, 1,
         cli=True),
    Case("duplicate_param", "world: 4\nparams:\n  a: 1\n  a: 2\nprogram: |\n  pass\n", "params: key 'a' appears twice", 4, 3),
    Case("unknown_top_level_key", "world: 4\nprogrm: |\n  pass\n", "unknown top-level key 'progrm'", 2, 1,
         hint="did you mean 'program'?"),
    Case("missing_program", "name: t\nworld: 4\n", "the schedule has no `program:` block", 1, 1),
    Case("missing_world", "name: t\nprogram: |\n  pass\n", "the schedule has no `world:`", 1, 1),
    Case("empty_file", "# nothing here\n", "the schedule file is empty", 1, 1),
    Case("not_a_mapping", "- world\n- program\n", "the schedule must be a mapping", 1, 1),
    Case("world_zero", "world: 0\nprogram: |\n  pass\n", "world must be an integer >= 1, got 0", 1, 8),
    Case("world_negative", "world: -2\nprogram: |\n  pass\n", "world must be an integer >= 1, got -2", 1, 8),
    Case("world_string", "world: four\nprogram: |\n  pass\n", "unknown name 'four'", 1, 8),
    Case("world_float", "world: 2.5\nprogram: |\n  pass\n", "world must be an integer >= 1, got 2.5", 1, 8),
    Case("world_list", "world: [1, 2]\nprogram: |\n  pass\n", "world must be a single value", 1, 8),
    Case("world_too_big", "world: 100000\nprogram: |\n  pass\n", "exceeds the limit of 65,536", 1, 8, error=LimitError),
    Case("mesh_axis_zero", "world: {pp: 2, dp: 0}\nprogram: |\n  pass\n", "mesh axis 'dp' must be an integer >= 1", 1, 20),
    Case("group_rank_out_of_range", "world: 4\ngroups:\n  pairs: [[0, 1], [2, 9]]\nprogram: |\n  pass\n",
         "group 'pairs': rank 9 is out of range", 3, 23),
    Case("group_duplicate_rank", "world: 4\ngroups:\n  pairs: [[0, 1], [1, 2]]\nprogram: |\n  pass\n",
         "group 'pairs': rank 1 appears twice", 3, 20),
    Case("group_named_world", "world: 4\ngroups:\n  world: [0, 1]\nprogram: |\n  pass\n", "group 'world' is already defined",
         3, 3),
    Case("group_not_a_list", "world: 4\ngroups:\n  pairs: 3\nprogram: |\n  pass\n", "group 'pairs' must be a list of ranks",
         3, 10),
    Case("stream_twice", "world: 4\nstreams: [a, a]\nprogram: |\n  pass\n", "stream 'a' is declared twice", 2, 14),
    Case("stream_named_host", "world: 4\nstreams: [compute, host]\nprogram: |\n  pass\n", "'host' is the host thread", 2, 20),
    Case("bad_dtype", "world: 4\ndtype: bf17\nprogram: |\n  pass\n", "unknown dtype 'bf17'", 2, 8),
    Case("program_folded", "world: 4\nprogram: >\n  pass\n", "`program: >` folds the program's lines together", 2, 10),
    Case("program_not_text", "world: 4\nprogram: 3\n", "`program:` must be a text block", 2, 10),
    Case("program_quoted_one_line", 'world: 4\nprogram: "compute F zz"\n', "unknown name 'zz'", 2, 21),
    Case("param_syntax", "world: 4\nparams:\n  n: 4 +\nprogram: |\n  pass\n", "unexpected end of program; expected an expression",
         3, 9),
    Case("param_forward_reference", "world: 4\nparams:\n  a: b * 2\n  b: 1\nprogram: |\n  pass\n", "unknown name 'b'", 3, 6),
    Case("param_infinite", "world: 4\nparams:\n  a: .inf\nprogram: |\n  pass\n", "param 'a' must be a finite number", 3, 6),
    Case("param_reserved", "world: 4\nparams:\n  rank: 1\nprogram: |\n  pass\n", "'rank' is reserved", 3, 3),
    # ---- memory and pipeline statements -------------------------------------------------------------
    Case("alloc_twice", prog("alloc x 1MiB", "alloc x 1MiB"), "buffer 'x' is already allocated (line 12)", P + 2, 3, cli=True),
    Case("free_unknown", prog("alloc act 1MiB", "free atc"), "free atc: no live buffer of that name on rank 0", P + 2, 3,
         hint="did you mean 'act'?", rank=0),
    Case("free_on_another_stream", prog("alloc x 1MiB on comm", "free x"),
         "free x on stream compute, but it was allocated on stream comm (line 12)", P + 2, 3, hint="free it `on comm`"),
    Case("alloc_not_a_size", prog("alloc x t_fwd"), "expected a size such as 32MiB or bf16[1024], got a duration", P + 1, 11),
    Case("alloc_handle", prog("h = alloc x 1MiB"), "alloc returns no handle", P + 1, 7),
    Case("pipeline_options_partial", prog("compute F t_fwd action=forward stage=0"), "missing microbatch", P + 1, 19),
    Case("pipeline_unknown_action", prog("compute F t_fwd action=fwd stage=0 microbatch=0"), "unknown action 'fwd'", P + 1, 19),
    Case("pipeline_negative_stage", prog("compute F t_fwd action=forward stage=rank - 1 microbatch=0"),
         "stage= takes a non-negative integer, got -1", P + 1, 34),
    Case("stage_send_unmatched", prog("if rank == 0:", "    stage_send x 1MiB to 1"),
         "stage_send x on rank 0 has no stage_recv x on rank 1", P + 2, 7, cli=True),
    Case("stage_recv_in_batch", prog("batch:", "    stage_recv x 1MiB from (rank + 1) % 4"),
         "a batch holds isend/irecv only, not stage_recv", P + 2, 7),
    Case("stage_send_handle", prog("h = stage_send x 1MiB to (rank + 1) % 4"), "stage_send returns no handle", P + 1, 7),
    Case("stage_duplicate_name", prog("if rank == 0:", "    compute F t_fwd", "    stage_send x 1MiB to 1", "    stage_send x 1MiB to 1",
                                      "if rank == 1:", "    stage_recv x 1MiB from 0"),
         "repeats a transfer of that name between ranks 0 and 1", P + 4, 7, related_line=P + 3),
    Case("stage_cyclic_order", prog("if rank < 2:", "    stage_recv a[rank] 1MiB from 1 - rank", "    compute F t_fwd",
                                    "    stage_send a[1 - rank] 1MiB to 1 - rank"),
         "the pipeline's compute order is cyclic", P + 2, 7, error=DeadlockError),
    Case("stage_mixed_with_plain", prog("if rank == 0:", "    compute F t_fwd", "    stage_send x 1MiB to 1", "    send y 1MiB to 1",
                                        "if rank == 1:", "    stage_recv x 1MiB from 0", "    recv y 1MiB from 0"),
         "carries stage transfers and plain sends", P + 4, 7, related_line=P + 3),
    # ---- -p overrides ------------------------------------------------------------------------------
    Case("override_unknown_param", prog("pass"), "-p nn=...: the schedule has no param 'nn'", None, None, error=UsageError,
         overrides={"nn": "3"}, hint="did you mean 'n'?"),
    Case("override_syntax", prog("pass"), "unexpected end of program; expected an expression", 1, 3, overrides={"n": "4+"}),
    Case("override_wrong_unit", prog("compute F t_fwd"), "compute takes a duration (2ms) or work (4GFLOP), got a size",
         P + 1, 13, overrides={"t_fwd": "4MiB"}),
]  # fmt: skip


def _run_case(case: Case) -> CommdslError:
    kwargs = {"max_ops": case.max_ops} if case.max_ops else {}
    with pytest.raises(CommdslError) as info:
        load_schedule_text(case.text, "bad.yaml", case.overrides, **kwargs)
    return info.value


def test_table_is_large_enough():
    assert len(CASES) >= 35
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    assert sum(c.cli for c in CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case):
    err = _run_case(case)
    assert type(err) is case.error, f"{type(err).__name__}: {err.format()}"
    assert case.message in err.message, err.format()
    formatted = err.format()
    assert len(formatted.splitlines()) <= 25, "the message must fit on one screen"
    assert "Traceback" not in formatted
    if case.hint is not None:
        assert err.hint is not None and case.hint in err.hint, formatted
    if case.rank is not None:
        assert err.rank == case.rank, formatted
    if case.line is None:
        assert err.loc is None
        return
    assert err.loc is not None, formatted
    assert (err.loc.line, err.loc.column) == (case.line, case.column), formatted
    if case.overrides and err.loc.file.startswith("-p "):
        expected_text = next(iter(case.overrides.values()))
    else:
        assert err.loc.file == "bad.yaml"
        expected_text = case.text.splitlines()[case.line - 1]
    # The caret display: the file's real line, then a caret under the column.
    assert err.loc.text == expected_text
    assert f"--> {err.loc.file}:{case.line}:{case.column}" in formatted
    lines = formatted.splitlines()
    shown = next(i for i, line in enumerate(lines) if line.startswith(f"{case.line} | "))
    assert lines[shown] == f"{case.line} | {expected_text}"
    caret = lines[shown + 1]
    assert caret.rstrip().endswith("^")
    assert caret.index("^") - caret.index("|") - 2 == case.column - 1
    if case.related_line is not None:
        assert any(r.line == case.related_line for _, r in err.related), formatted
        assert re.search(rf"--> bad\.yaml:{case.related_line}:\d+ ", formatted), formatted


def _cli(args: list[str], cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


CLI_CASES = [c for c in CASES if c.cli]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_bad_input_through_cli(case: Case, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(case.text)
    args = ["check", str(path)]
    for key, value in case.overrides.items():
        args += ["-p", f"{key}={value}"]
    if case.max_ops:
        args += ["--max-ops", str(case.max_ops)]
    proc = _cli(args)
    assert proc.returncode == case.error.exit_code == 1, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert case.message in proc.stderr
    assert f"--> {path}:{case.line}:{case.column}" in proc.stderr
    assert re.search(r"^\s*\|\s*\^$", proc.stderr, re.M), proc.stderr
    assert len(proc.stderr.splitlines()) <= 25


def test_cli_usage_errors_exit_2(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(prog("compute F t_fwd"))
    cases = [
        (["check", str(path), "-p", "n"], "-p takes KEY=VALUE"),
        (["check", str(path), "-p", "=3"], "-p takes KEY=VALUE"),
        (["check", str(path), "-p", "nn=3"], "the schedule has no param 'nn'"),
        (["check", str(path), "-p", "n=3", "-p", "n=4"], "-p n is given twice"),
        (["check", str(tmp_path / "missing.yaml")], "no such schedule file or bundled schedule"),
        (["check", "no_such_bundled_schedule"], "no such schedule file or bundled schedule"),
        (["check", str(path), "--max-ops", "0"], "--max-ops must be at least 1"),
        (["check", str(path), "--max-ops", "many"], "invalid int value"),
        (["check"], "the following arguments are required"),
        (["frobnicate"], "invalid choice"),
    ]
    for args, message in cases:
        proc = _cli(args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_cli_override_error_points_at_the_override(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(prog("compute F t_fwd"))
    proc = _cli(["show", str(path), "-p", "t_fwd=2ms +"])
    assert proc.returncode == 1
    assert "--> -p t_fwd:1:6" in proc.stderr
    assert "1 | 2ms +" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = _cli(["check", str(path), "-p", "t_fwd=3ms", "-p", "n=2"])
    assert ok.returncode == 0, ok.stderr
    assert "t_fwd=3ms" in ok.stdout


def test_giant_loop_fails_fast():
    start = time.perf_counter()
    with pytest.raises(LimitError):
        load_schedule_text(prog("for i in range(10**12):", "    compute F 1ms"), "bad.yaml")
    with pytest.raises(LimitError):
        load_schedule_text(prog("for i in range(10**15):", "    for j in range(10**15):", "        pass"), "bad.yaml")
    # Checked before expanding: evaluated one by one, these loops would never end (the bound is
    # generous, so that a busy machine cannot fail it).
    assert time.perf_counter() - start < 30.0


def test_max_ops_default_and_configurable():
    from commdsl.dsl import DEFAULT_MAX_OPS

    assert 1_000_000 <= DEFAULT_MAX_OPS <= 10_000_000
    text = prog("for i in range(50):", "    compute F[i] 1ms")
    assert load_schedule_text(text, "ok.yaml", max_ops=200).num_ops == 200
    with pytest.raises(LimitError, match="more than 199 ops"):
        load_schedule_text(text, "ok.yaml", max_ops=199)


def test_deep_nesting_is_a_schedule_error():
    # Parentheses alone add no depth; unary minus and nested sums do.
    assert load_schedule_text(prog("x = " + "(" * 3000 + "1" + ")" * 3000), "ok.yaml").num_ops == 0
    for deep in ("x = " + "-" * 3000 + "1", "x = " + "(1 + " * 3000 + "1" + ")" * 3000):
        with pytest.raises(LimitError, match="nests too deeply"):
            load_schedule_text(prog(deep), "bad.yaml")
    yaml_deep = "world: 4\nparams: " + "[" * 5000 + "]" * 5000 + "\nprogram: |\n  pass\n"
    with pytest.raises(ScheduleError):
        load_schedule_text(yaml_deep, "bad.yaml")


def test_quoted_program_with_escapes_points_at_its_start():
    err = _run_case(Case("q", 'world: 4\nprogram: "pass\\ncompute F zz"\n', "", 0, 0))
    assert "unknown name 'zz'" in err.message
    assert (err.loc.line, err.loc.column) == (2, 11)
