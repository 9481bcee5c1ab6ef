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
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import SNIPPET_WIDTH, CommdslError, DeadlockError, LimitError, ScheduleError, UsageError, ValidationError
from commdsl.files import source_lines

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


def param(value: str) -> str:
    """A schedule whose param `a` (line 3, column 6) is `value`."""
    return f"world: 4\nparams:\n  a: {value}\nprogram: |\n  pass\n"


NO_HINT = ""
"""As a row's hint: the error must have none (a hint that does not fit misleads)."""


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
    """A substring of the hint; NO_HINT: no hint at all; None: not checked."""
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
    Case("keyword_as_name", prog("send = 3"), "`send` is an op of the language: it cannot name a value", P + 1, 3),
    Case("python_while", prog("i = 0", "while i < 3:", "    i = i + 1"), "`while` is Python, not part of the schedule language", P + 2, 3,
         hint="loop with `for NAME in range(N):`"),
    Case("python_break", prog("for i in range(3):", "    break"), "`break` is Python", P + 2, 7),
    Case("python_import", prog("import os"), "`import` is Python", P + 1, 3),
    Case("elif_without_if", prog("compute a 1ms", "elif rank == 0:", "    compute b 1ms"), "`elif` with no `if` block above it", P + 2, 3),
    Case("augmented_assignment", prog("x = 1", "x += 1"), "`x += 1`: the language has no augmented assignment", P + 2, 3,
         hint="write `x = x + 1`"),
    Case("collective_without_size", prog("all_reduce grads group=world"), "`all_reduce` needs a size after its name", P + 1, 3),
    Case("send_without_to", prog("if rank == 0:", "    send x 1MiB 1"), "`send` names its peer with `to`", P + 2, 7,
         hint="write `send NAME SIZE to RANK`"),
    Case("world_whole_float", "world: 2.0\nprogram: |\n  pass\n", "world must be an integer >= 1, got 2.0", 1, 8, hint="write 2"),
    Case("yaml_colon_in_value", "world: 2\ndoc: MoE layer: 8 experts\nprogram: |\n  pass\n", "mapping values are not allowed", 2, 15,
         hint="a value with ': ' in it needs quotes"),
    Case("unknown_function_no_block_hint", prog("compute a sqrt(4) * 1ms"), "unknown function 'sqrt'", P + 1, 13, hint=NO_HINT),
    Case("block_called_in_expression", prog("def f():", "    compute a 1ms", "x = f()"), "unknown function 'f'", P + 3, 7,
         hint="blocks defined with `def` are statements"),
    Case("error_in_block_shows_its_call", prog("def hop(peer):", "    send x 1MiB to peer", "if rank == 0:", "    hop(rank + 1)",
                                               "if rank == 1:", "    recv x 1MiB from 0", "if rank == 3:", "    hop(rank + 1)"),
         "peer 4 is out of range", P + 2, 22, related_line=P + 8),
    Case("program_plain_over_lines", "world: 2\nprogram:\n  compute f 1ms\n  all_reduce g 4MiB\n",
         "`program:` written as plain text over several lines: YAML joins its lines into one", 3, 3),
    Case("misspelled_op", prog("allreduce g 1MiB"), "unexpected 'g'; expected '(', '=', '[', end of line", P + 1, 13,
         hint="did you mean 'all_reduce'?", cli=True),
    Case("misspelled_compute", prog("computee F 1ms"), "unexpected 'F'; expected '(', '=', '[', end of line", P + 1, 12,
         hint="did you mean 'compute'?"),
    Case("misspelled_op_in_block", prog("if rank == 0:", "    sned x 1MiB to 1"), "unexpected 'x'; expected '(', '=', '[', end of line",
         P + 2, 12, hint="did you mean 'send'?"),
    Case("misspelled_op_alone", prog("barier"), "unexpected end of line; expected '(', '=', '['", P + 1, 9,
         hint="did you mean 'barrier'?"),
    Case("misspelled_op_for_a_handle", prog("h = isendd x 1MiB to 1 - rank"), "unexpected 'x'; expected end of line", P + 1, 14,
         hint="did you mean 'isend'?"),
    Case("expression_not_an_op", prog("x = 2 * sendd y"), "unexpected 'y'; expected end of line", P + 1, 17, hint=NO_HINT),
    Case("unrelated_first_word", prog("foo g 1MiB"), "unexpected 'g'; expected '(', '=', '[', end of line", P + 1, 7, hint=NO_HINT),
    Case("block_named_like_op", prog("def sendd(a):", "    pass", "sendd x"), "unexpected 'x'; expected '(', '=', '[', end of line",
         P + 3, 9, hint=NO_HINT),
    Case("param_named_like_op", "world: 4\nparams:\n  sendd: 1\nprogram: |\n  sendd x 1MiB to 1\n",
         "unexpected 'x'; expected '(', '=', '[', end of line", 5, 9, hint=NO_HINT),
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
    # ---- copies to another rank -----------------------------------------------------------
    Case("copy_to_self", prog("copy x 4MiB to rank"), "rank 0 cannot copy to itself with `to 0`", P + 1, 18, rank=0,
         hint="a copy within the rank's own device memory has no peer: `copy x SIZE`"),
    Case("copy_out_of_range", prog("copy x 4MiB to rank + 4"), "the copy's destination 4 is out of range: the world has ranks 0..3",
         P + 1, 18, rank=0, cli=True),
    Case("copy_from_rank", prog("copy x 4MiB from 1"), "a copy writes another rank's buffer (`to RANK`), it does not read one",
         P + 1, 15),
    Case("copy_into_without_peer", prog("copy x 4MiB into y"), "`into NAME` names the destination buffer of a copy to another rank",
         P + 1, 15),
    Case("copy_into_host", prog("copy x 4MiB to host into y"), "`into NAME` names the destination buffer", P + 1, 23),
    # ---- host memory of a copy ------------------------------------------------------------
    Case("copy_memory_device", prog("copy x 4MiB memory=pageable"), "this copy moves device memory only", P + 1, 15,
         hint="drop memory=, or copy `from host` / `to host`"),
    Case("copy_memory_peer", prog("copy x 4MiB to (rank + 1) % 4 memory=pinned"), "this copy moves device memory only", P + 1, 33),
    Case("copy_memory_unknown", prog("copy x 4MiB from host memory=locked"),
         "unknown memory 'locked'; expected one of pinned, pageable", P + 1, 25),
    Case("copy_into_two_sizes", prog("if rank == 0:", "    copy x 4MiB to 3 into y", "if rank == 1:", "    copy z 8MiB to 3 into y"),
         "rank 1 copies 8MiB of fp32 into y on rank 3, but rank 0 copies 4MiB of fp32 into the same buffer", P + 4, 7,
         error=ValidationError, related_line=P + 2, rank=1),
    Case("memcpy_isend_in_batch", prog("batch:", "    isend x 4MiB to (rank + 1) % 4 transport=memcpy"),
         "isend x uses transport memcpy, which a batch cannot hold", P + 2, 7, rank=0,
         hint="put memcpy transfers on streams of their own to overlap them"),
    # ---- collectives ----------------------------------------------------------------------
    Case("root_missing", prog("broadcast x 4MiB"), "broadcast needs its root: src=RANK", P + 1, 3),
    Case("root_out_of_range", prog("broadcast x 4MiB src=4"), "root 4 is out of range", P + 1, 24),
    Case("root_not_in_group", prog("broadcast x 4MiB src=3 group=pairs"), "root 3 is not in group pairs[0]", P + 1, 24),
    Case("wrong_root_option", prog("reduce x 4MiB src=0"), "reduce has no option 'src'", P + 1, 17),
    Case("rank_not_member", prog("all_reduce g 4MiB group=low"), "rank 2 is not a member of group 'low'", P + 1, 3, rank=2),
    Case("size_not_splittable", prog("reduce_scatter x 8B"), "does not split into 4 equal chunks", P + 1, 20),
    Case("size_not_whole_elements", prog("all_reduce g 6B"), "not a multiple of the fp32 element size (4B)", P + 1, 16),
    Case("duration_where_size_goes", prog("all_reduce g 5ms"), "expected a size such as 32MiB", P + 1, 16, cli=True),
    Case("negative_size", prog("all_reduce g 0B - 4B"), "all_reduce g: size must not be negative, got -4B", P + 1, 16),
    Case("negative_size_as_written", prog("all_reduce g -1MiB"), "all_reduce g: size must not be negative, got -1MiB", P + 1, 16),
    Case("alloc_negative_size", prog("alloc x -1.5KiB"), "alloc x: size must not be negative, got -1.5KiB", P + 1, 11),
    Case("size_not_whole_bytes", prog("all_reduce g 10000000.5B"), "size 10000000.5B is not a whole number of bytes", P + 1, 16),
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
    Case("past_max_ops", prog("for i in range(1000):", "    compute F[i] 1ms"), "expands to more than 100 ops", P + 1, 3,
         error=LimitError, max_ops=100, cli=True),
    Case("past_max_ops_by_one", prog("for i in range(25):", "    compute F[i] 1ms", "if rank == 3:", "    compute G 1ms"),
         "expands to more than 100 ops", P + 4, 7, error=LimitError, max_ops=100),
    Case("giant_loop", prog("for i in range(10**12):", "    compute F 1ms"),
         "this loop would run 1,000,000,000,000 iterations", P + 1, 3, error=LimitError),
    Case("giant_loop_past_ssize", prog("for i in range(2**62 * 3):", "    compute F 1ms"), "integer result out of range", P + 1, 18),
    Case("giant_loop_huge", prog("for i in range(-(2**62), 2**62):", "    compute F 1ms"), "expansion is limited to 20,000,000 loop iterations and block calls over all ranks: this loop would run",
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
    Case("collective_algo", prog("if rank == 0:", "    all_reduce g 64MiB algo=ring", "else:", "    all_reduce g 64MiB algo=tree"),
         "differs between ranks (algo): rank 0 issues `all_reduce g 64MiB fp32 op=sum algo=ring` but rank 1 issues", P + 4, 7,
         error=ValidationError, related_line=P + 2, rank=1),
    Case("collective_proto", prog("if rank == 0:", "    all_reduce g 64MiB proto=simple", "else:", "    all_reduce g 64MiB proto=ll"),
         "differs between ranks (proto)", P + 4, 7, error=ValidationError, related_line=P + 2, rank=1),
    Case("collective_count", prog("if rank != 3:", "    all_reduce g 4MiB"),
         "rank 0 issues 1 collective(s) on group world but rank 3 issues 0", P + 2, 7, error=ValidationError),
    Case("barrier_count", prog("if rank != 3:", "    barrier"),  # a barrier has no name: not `barrier barrier`
         "rank 0 issues 1 collective(s) on group world but rank 3 issues 0; the first without a partner is `barrier`",
         P + 2, 7, error=ValidationError),
    # ---- YAML and the schedule's keys -----------------------------------------------------------
    Case("yaml_syntax", "name: t\nworld: 4\nparams: {a: [1, 2}\nprogram: |\n  pass\n", "invalid YAML", 3, 18, cli=True),
    Case("yaml_bad_indent", "name: t\nworld: 4\nprogram: |\n  pass\n streams: [a]\n", "invalid YAML", 5, 2),
    Case("yaml_unclosed_mapping", "name: t\nworld: {ranks: 2\nprogram: |\n  pass\n",
         "(while parsing a flow mapping that starts at 2:8)", 3, 8, related_line=2, cli=True),
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
    Case("world_empty_mesh", "world: {}\nprogram: |\n  pass\n", "`world: {}` names no mesh axis", 1, 8, cli=True,
         hint="world: 4, or world: {pp: 4}"),
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
    # ---- YAML the safe constructor cannot build: an error at the value, never a traceback -------------
    Case("yaml_bool_maybe", param("!!bool maybe"), "invalid YAML value: maybe is not a valid !!bool", 3, 6, cli=True),
    Case("yaml_int_empty", param('!!int ""'), 'invalid YAML value: "" is not a valid !!int', 3, 6, cli=True),
    Case("yaml_float_empty", param('!!float ""'), 'invalid YAML value: "" is not a valid !!float', 3, 6),
    Case("yaml_bad_timestamp", param("!!timestamp 2020-13-45"), "2020-13-45 is not a valid !!timestamp (month must be in 1..12)",
         3, 6),
    Case("yaml_implicit_bad_date", param("2020-02-30"), "2020-02-30 is not a valid !!timestamp", 3, 6),
    Case("yaml_huge_int", param("1" + "0" * 5000), "is not a valid !!int", 3, 6),
    Case("yaml_unknown_tag", param("!python/object:os.system ls"), "could not determine a constructor for the tag", 3, 6),
    Case("yaml_set_of_list", param("!!set [1]"), "expected a mapping node, but found sequence", 3, 6),
    Case("yaml_bad_tag_in_groups", "world: 4\ngroups:\n  pairs: [[0, !!int x]]\nprogram: |\n  pass\n", "x is not a valid !!int",
         3, 15),
    Case("yaml_too_deep", param("[" * 100 + "]" * 100), "nests lists and mappings more than 64 deep", 3, 68),
    # ---- values that overflow or are not finite: an error at the expression that made them ----------
    Case("size_overflow", prog("x = 1e308B * 2"), "arithmetic overflow", P + 1, 7, cli=True),
    Case("size_sum_overflow", prog("x = 1e308B + 1e308B"), "arithmetic overflow", P + 1, 7),
    Case("size_difference_overflow", prog("x = -(1e308B) - 1e308B"), "arithmetic overflow", P + 1, 7),
    Case("size_quotient_overflow", prog("x = 1e308B / 1e-10"), "arithmetic overflow", P + 1, 7),
    Case("duration_overflow", prog("x = 1e300s * 1e10"), "arithmetic overflow", P + 1, 7),
    Case("work_literal_overflow", prog("compute F 1e300PFLOP"), "quantity 1e300PFLOP is too large", P + 1, 13),
    Case("size_doubling_overflow", prog("x = 1MiB", "for i in range(2000):", "    x = x + x"), "arithmetic overflow", P + 3, 11),
    Case("param_nan", param(".nan"), "param 'a' must be a finite number, got .nan", 3, 6),
    # ---- what a schedule may ask for: sizes, durations and work per op (docs/limits.md) --------------
    Case("compute_duration_limit", prog("compute F[3] 1e300s"), "compute F[3]: duration 1e+300s is more than the limit of 1e+06s per op",
         P + 1, 16, cli=True, hint="docs/limits.md"),
    Case("host_duration_limit", prog("host H 1e300s"), "host H: duration 1e+300s is more than the limit", P + 1, 10),
    Case("compute_work_limit", prog("compute F 1e30PFLOP"), "compute F: flops 1e+30PFLOP is more than the limit of 1e+06PFLOP",
         P + 1, 13),
    Case("compute_flops_option_limit", prog("compute F flops=1e30PFLOP"), "compute F: flops", P + 1, 13),
    Case("compute_bytes_limit", prog("compute F 1ms bytes=2000TiB"), "compute F: bytes 2000TiB is more than the limit of 1024TiB",
         P + 1, 17),
    Case("collective_size_limit", prog("all_reduce g 1e296TiB"), "all_reduce g: size 1.1e+308B is more than the limit of 1024TiB",
         P + 1, 16),
    Case("p2p_size_limit", prog("send x 2000TiB to (rank + 1) % 4"), "send x: size 2000TiB is more than the limit", P + 1, 10),
    Case("copy_size_limit", prog("copy c 2000TiB"), "copy c: size 2000TiB is more than the limit", P + 1, 10),
    Case("compute_negative_duration", prog("compute F 0ms - 1ms"), "compute F: duration must not be negative, got -1ms", P + 1, 13),
    Case("host_negative_duration", prog("host H 0ms - 1ms"), "host H: duration must not be negative", P + 1, 10),
    Case("compute_negative_bytes", prog("compute F 1ms bytes=-1MiB"), "compute F: bytes must not be negative, got -1MiB", P + 1, 17),
    Case("compute_negative_work", prog("compute F -1GFLOP"), "compute F: flops must not be negative, got -1GFLOP", P + 1, 13),
    # ---- scale: refused up front, and expansion limits that trip before the work ----------------------
    Case("mesh_too_big", "world: {a: 1024, b: 1024}\nprogram: |\n  pass\n", "world of 1,048,576 ranks exceeds the limit of 65,536",
         1, 8, error=LimitError),
    Case("nested_loops_1e15", prog("for i in range(100000):", "    for j in range(100000):", "        for k in range(100000):",
                                   "            compute F 1us"),
         "this loop would add at least 1,000,000,000,000,000 (100,000 iterations of at least 10,000,000,000 each)", P + 1, 3,
         error=LimitError, cli=True),
    Case("nested_blocks_1e12", prog("def a():", "    for i in range(1000):", "        compute F 1us", "def b():",
                                    "    for i in range(1000):", "        a()", "def c():", "    for i in range(1000):",
                                    "        b()", "c()"),
         "this loop would add at least 1,000,000,000 (1,000 iterations of at least 1,000,000 each)", P + 8, 7, error=LimitError),
    Case("block_args_bound_the_loop", prog("def f(k):", "    for i in range(k):", "        compute F 1us", "for i in range(10000):",
                                           "    f(10000)"), "this loop would add at least 100,000,000", P + 4, 3, error=LimitError),
    Case("nested_empty_loops", prog("for i in range(10000):", "    for j in range(10000):", "        pass"),
         "limited to 20,000,000 loop iterations and block calls over all ranks: this loop would add at least 100,000,000", P + 1, 3,
         error=LimitError),
    Case("loop_counts_every_rank", prog("for i in range(200):", "    compute F 1us"),
         "this loop would add at least 200 (200 iterations of at least 1 each) to the 400 made so far", P + 1, 3,
         error=LimitError, max_ops=500, rank=2),
    # ---- accepted though invalid: keys no expression can name, digits of other scripts -----------------
    Case("param_key_number", "world: 4\nparams: {1: 2}\nprogram: |\n  pass\n", "params: keys must be names", 2, 10, cli=True),
    Case("param_key_non_ascii", "world: 4\nparams:\n  \u00e9: 2\nprogram: |\n  pass\n", "params: keys must be names", 3, 3),
    Case("param_key_quoted_spaces", 'world: 4\nparams:\n  "a b": 2\nprogram: |\n  pass\n', "got 'a b'", 3, 3),
    Case("group_key_number", "world: 4\ngroups:\n  7: [0, 1]\nprogram: |\n  pass\n", "groups: keys must be names", 3, 3),
    Case("mesh_axis_key_number", "world: {1: 4}\nprogram: |\n  pass\n", "world: keys must be names", 1, 9),
    Case("fullwidth_digit", prog("x = \uff11"), "unexpected character '\uff11'", P + 1, 7, hint="digits 0-9", cli=True),
    Case("fullwidth_digit_quantity", prog("compute F \uff11ms"), "unexpected character '\uff11'", P + 1, 13, hint="digits 0-9"),
    Case("arabic_indic_digit", prog("x = \u0663"), "unexpected character '\u0663'", P + 1, 7, hint="digits 0-9"),
    Case("fullwidth_world", "world: \uff14\nprogram: |\n  pass\n", "unexpected character '\uff14'", 1, 8),
    Case("non_ascii_name", prog("\u00e9 = 1"), "unexpected character '\u00e9'", P + 1, 3, hint="ASCII"),
    Case("control_character_in_yaml", prog("x = 1 \x01"), "invalid YAML: unacceptable character U+0001", P + 1, 9),
    Case("invisible_character_shown_by_code", prog("x = 1 \u200b"), "unexpected character U+200B", P + 1, 9),
    Case("unicode_line_separator", prog("x = 1 \u2028 y = 2"), "character U+2028 is not allowed: end lines with a newline",
         P + 1, 9),
    Case("lone_carriage_return", "world: 4\rprogram: |\n  pass\n", "character U+000D is not allowed", 1, 9),
    # ---- messages show the user's text, never Python reprs -------------------------------------------
    Case("dtype_mapping", "world: 4\ndtype: {a: 1}\nprogram: |\n  pass\n", "unknown dtype a mapping; expected one of", 2, 8),
    Case("transport_list", "world: 4\ntransport: [nccl]\nprogram: |\n  pass\n", "unknown transport a list; expected one of", 2, 12),
    Case("transport_number", "world: 4\ntransport: 3\nprogram: |\n  pass\n", "unknown transport 3; expected one of", 2, 12),
    Case("peer_boolean", prog("send x 4MiB to true"), "peer must be an integer rank, got true", P + 1, 18),
    Case("peer_size", prog("send x 4MiB to 1MiB"), "peer must be an integer rank, got 1MiB", P + 1, 18),
]  # fmt: skip

PYTHON_REPRS = re.compile(r"Node\(|<class |object at 0x|\\x[0-9a-f]{2}|\bTrue\b|\bFalse\b|\bNone\b")
"""What a message must never show: Python's reprs of YAML nodes, objects, escaped text, constants."""


def _run_case(case: Case) -> CommdslError:
    kwargs = {"max_ops": case.max_ops} if case.max_ops else {}
    with pytest.raises(CommdslError) as info:
        load_schedule_text(case.text, "bad.yaml", case.overrides, **kwargs)
    return info.value


def test_a_world_made_of_a_param_given_on_the_command_line_names_it():
    """`-p stages=2.5` makes `world: {pp: stages}` no integer: the message points at the
    world, and the hint names the value given (the user typed it on the command line)."""
    from commdsl.dsl import load_schedule

    with pytest.raises(ScheduleError) as info:
        load_schedule("1f1b", {"stages": "2.5"})
    assert "mesh axis 'pp' must be an integer >= 1, got 2.5" in info.value.message
    assert info.value.hint == "the params given: -p stages=2.5"


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
    assert not PYTHON_REPRS.search(formatted), formatted
    if case.hint == NO_HINT:
        assert err.hint is None, formatted
    elif case.hint is not None:
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
        expected_text = source_lines(case.text)[case.line - 1]
    # The caret display: the file's real line, then a caret under the column.
    assert err.loc.text == expected_text
    assert f"--> {err.loc.file}:{case.line}:{case.column}" in formatted
    lines = formatted.splitlines()
    shown = next(i for i, line in enumerate(lines) if line.startswith(f"{case.line} | "))
    shown_text = lines[shown][len(f"{case.line} | "):]
    caret = lines[shown + 1]
    assert caret.rstrip().endswith("^")
    at = caret.index("^") - caret.index("|") - 2
    # What a terminal must not act on is shown as U+FFFD, one character for one.
    expected_text = "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in expected_text)
    if len(expected_text) <= SNIPPET_WIDTH:
        assert shown_text == expected_text
        assert at == case.column - 1
    else:  # a long line is shown clipped around the caret, which stays under its character
        assert len(shown_text) <= SNIPPET_WIDTH + 6
        assert shown_text.removeprefix("...").removesuffix("...") in expected_text
        assert shown_text[at] == expected_text[case.column - 1]
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


LONG_NAME = "a" * 300
"""A file name longer than any file system allows (255 bytes)."""

# Command lines that are wrong: exit 2 with the message, in-process through `commdsl.cli.main`
# ({ok}: a valid schedule, {dir}: a folder, {deep}: JSON nested 100,000 deep, {trace}: a
# predicted timeline of {ok}).
USAGE_CASES = [
    (["check", "{ok}", "-p", "n"], "-p takes KEY=VALUE"),
    (["check", "{ok}", "-p", "=3"], "-p takes KEY=VALUE"),
    (["check", "{ok}", "-p", "\uff4e=3"], "-p takes KEY=VALUE with KEY a param's name, got '\uff4e=3'"),
    (["check", "{ok}", "-p", "nn=3"], "the schedule has no param 'nn'"),
    (["check", "{ok}", "-p", "n=3", "-p", "n=4"], "-p n is given twice"),
    (["check", "{dir}/missing.yaml"], "no such schedule file or bundled schedule"),
    (["check", "no_such_bundled_schedule"], "no such schedule file or bundled schedule"),
    (["check", "{dir}"], "no such schedule file or bundled schedule"),
    (["check", "{dir}/" + LONG_NAME + ".yaml"], "no such schedule file or bundled schedule"),
    (["check", "{ok}", "--max-ops", "0"], "argument --max-ops: must be at least 1, got 0"),
    (["check", "{ok}", "--max-ops", "many"], "argument --max-ops: expected a whole number, got 'many'"),
    (["check"], "the following arguments are required"),
    (["frobnicate"], "invalid choice"),
    (["simulate", "{ok}", "--frob"], "unrecognized arguments: --frob\nhint: see `commdsl simulate --help`"),
    (["show", "{ok}", "--rank", "-1"], "argument --rank: must be at least 0, got -1"),
    (["show", "{ok}", "--rank", "4"], "--rank 4 is out of range"),
    (["simulate", "{ok}", "--links", "-1"], "argument --links: must be at least 1, got -1"),
    (["simulate", "{ok}", "--links", "0"], "argument --links: must be at least 1, got 0"),
    (["simulate", "{ok}", "--samples", "0"], "argument --samples: must be at least 1, got 0"),
    (["simulate", "{ok}", "--machine", "dgx-h100", "--nodes", "0"], "argument --nodes: must be at least 1, got 0"),
    (["simulate", "{ok}", "--machine", "dgx-h100", "--nodes", "100000000"],
     "--nodes 100,000,000: 100,000,000 x 8 GPUs = 800,000,000 devices, more than the limit of 65,536"),
    (["simulate", "{ok}", "--machine", "{dir}/" + LONG_NAME + ".yaml"], "no such machine file or preset"),
    (["simulate", "{ok}", "--trace", "{dir}/" + LONG_NAME + ".json"], "cannot write --trace {dir}/" + LONG_NAME + ".json: File name too long"),
    (["simulate", "{ok}", "--trace", "{dir}"], "cannot write --trace {dir}: Is a directory"),
    (["simulate", "{ok}", "--trace", "-"], "--trace -: give the path of a file to write"),
    (["simulate", "{ok}", "--trace", "{dir}/no/such/t.json"], "--trace {dir}/no/such/t.json: the folder {dir}/no/such does not exist"),
    (["simulate", "{ok}", "--trace-dir", "{ok}"], "--trace-dir {ok}: a file of that name exists; give a folder"),
    (["simulate", "{ok}", "--trace-dir", "{ok}/traces"], "--trace-dir {ok}/traces: {ok} is not a folder"),
    (["simulate", "{ok}", "--trace-dir", "{dir}/" + LONG_NAME], "cannot make --trace-dir {dir}/" + LONG_NAME + ": File name too long"),
    (["compare", "{trace}", "{trace}", "--html", "-"], "--html -: give the path of a file to write"),
    (["compare", "{dir}/" + LONG_NAME + ".json", "{trace}"], "no such timeline file"),
    (["compare", "{deep}", "{deep}"], "is not a timeline JSON file: the JSON nests too deeply"),
    (["compare", "{ok}", "{trace}"], "is not a timeline JSON file: expected a JSON object"),
    (["compare", "{trace}", "{trace}", "--min-duration", "nan"], "argument --min-duration: must be a finite number >= 0, got 'nan'"),
    (["compare", "{trace}", "{trace}", "--max-error", "-1"], "argument --max-error: must be a finite number >= 0, got '-1'"),
    (["compare", "{trace}", "{trace}", "--html", "{dir}/" + LONG_NAME + ".html"], "cannot write --html"),
    # profiler traces (a folder of them: {dir} holds deep.json first)
    (["compare", "{trace}", "{dir}"], "trace error: {dir}/deep.json is not a profiler trace: its JSON nests too deeply"),
    (["import", "kineto", "{dir}"], "trace error: {dir}/deep.json is not a profiler trace: its JSON nests too deeply"),
    (["import", "kineto", "{dir}/no_such_folder"], "no such trace file or folder: {dir}/no_such_folder"),
    (["compare", "{trace}", "{trace}", "--step", "1"], "--step applies to profiler traces"),
    (["import", "kineto", "{dir}", "--tolerance", "-1"], "--tolerance must be a number of microseconds >= 0, got -1.0"),
    (["run", "{ok}", "--profile", "{trace}"], "--profile {trace}: a file of that name exists; give a folder"),
]  # fmt: skip


@pytest.fixture
def cli_files(tmp_path) -> dict[str, str]:
    """The files USAGE_CASES and OUTPUT_CASES name."""
    from commdsl.cli import main

    ok = tmp_path / "ok.yaml"
    ok.write_text(prog("compute F t_fwd"))
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    trace = tmp_path / "predicted.json"
    assert main(["simulate", str(ok), "--trace", str(trace), "--json"]) == 0
    return {"ok": str(ok), "dir": str(tmp_path), "deep": str(deep), "trace": str(trace)}


def test_cli_usage_errors_exit_2(cli_files, capsys):
    from commdsl.cli import main

    capsys.readouterr()
    assert len(USAGE_CASES) >= 25
    for args, message in USAGE_CASES:
        args = [a.format(**cli_files) for a in args]
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        assert message.format(**cli_files) in err, (args, err)
        assert "Traceback" not in err and not PYTHON_REPRS.search(err), err
        assert len(err) < 2000, "the message must fit on one screen"


# Every command's output to a full disk (/dev/full) and to a reader that has gone (a closed
# pipe): an "output error" (exit 1) for the first, a quiet exit 1 for the second; never a traceback.
OUTPUT_CASES = [
    ["list"],
    ["check", "{ok}"],
    ["check", "{ok}", "--json"],
    ["show", "{ok}"],
    ["show", "{ok}", "--json"],
    ["simulate", "{ok}"],
    ["simulate", "{ok}", "--json"],
    ["compare", "{trace}", "{trace}"],
    ["compare", "{trace}", "{trace}", "--json"],
]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", OUTPUT_CASES, ids=[" ".join(a) for a in OUTPUT_CASES])
def test_output_to_a_full_disk_or_a_closed_pipe(args, cli_files):
    args = [a.format(**cli_files) for a in args]
    cmd = [sys.executable, "-m", "commdsl.cli", *args]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("output error: cannot write the output: No space left on device"), proc.stderr
    assert "Traceback" not in proc.stderr
    # A reader that closed its end before the first byte: `commdsl ... | head -0`.
    piped = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    piped.stdout.close()
    err = piped.stderr.read()
    assert piped.wait(timeout=60) == 1, err
    assert err == "", err


# Files that are not UTF-8 text: a schedule or machine error at the first bad byte's line
# and column (in characters), with the line shown (the bad byte as U+FFFD).
FILE_CASES = [
    ("schedule", b"name: t\nworld: 2\nprogram: |\n  compute F 1ms # caf\xe9\n", 4, 22),
    ("schedule", b"\xff\xfeworld: 2\n", 1, 1),
    ("schedule", "name: t\ndoc: \u00e9t\u00e9\nworld: 2\nprogram: |\n  pass \u00e9".encode() + b"\x80\n", 5, 9),
    ("machine", b"name: m\ndevice: {name: caf\xe9}\n", 2, 19),
]


@pytest.mark.parametrize("kind, data, line, column", FILE_CASES)
def test_file_not_utf8_points_at_the_byte(kind, data, line, column, tmp_path):
    from commdsl.dsl import load_schedule
    from commdsl.errors import MachineError
    from commdsl.machine import load_machine

    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    error, load = (ScheduleError, load_schedule) if kind == "schedule" else (MachineError, load_machine)
    with pytest.raises(error) as info:
        load(str(path))
    err = info.value
    assert f"the {kind}" in err.message and "is not UTF-8 text: byte 0x" in err.message
    assert (err.loc.line, err.loc.column) == (line, column), err.format()
    assert err.loc.text[column - 1] == "\ufffd"
    assert "cannot be decoded" in err.format() and "codec" not in err.format()


def test_a_schedule_saved_as_utf16_with_its_bom_loads_as_its_text(tmp_path):
    from commdsl.dsl import load_schedule, load_schedule_text

    text = "name: t\nworld: 2\nprogram: |\n  compute F 1ms\n"
    path = tmp_path / "ps.yaml"
    path.write_bytes(text.encode("utf-16"))  # Windows PowerShell's `>` writes UTF-16 with a byte-order mark
    assert load_schedule(str(path)).ops == load_schedule_text(text, str(path)).ops


# An error on a very long line: the message stays short, the caret under the culprit (the
# first character of the case's marker, which names where the error is).
CLIP_CASES = [
    ("end_of_long_program_line", prog("compute F 1ms" + " " * 400_000 + "$"), "$"),
    ("start_of_long_program_line", prog("compute F 1ms $" + " " * 400_000 + "# end"), "$"),
    ("middle_of_long_program_line", prog("x = 1" + " + 1" * 5_000 + " + zz" + " + 1" * 5_000), "zz"),
    ("long_yaml_value", "world: 4\nparams:\n  a: !!int " + "9" * 400_000 + "x\nprogram: |\n  pass\n", "!!int"),
    ("long_unknown_name", prog("compute F " + "q" * 400_000), "q"),
]


@pytest.mark.parametrize("case_id, text, marker", CLIP_CASES, ids=[c[0] for c in CLIP_CASES])
def test_errors_on_long_lines_fit_a_screen(case_id, text, marker):
    line = next(n for n, x in enumerate(text.splitlines(), 1) if marker in x)
    column = text.splitlines()[line - 1].index(marker) + 1
    with pytest.raises(CommdslError) as info:
        load_schedule_text(text, "bad.yaml")
    err = info.value
    assert (err.loc.line, err.loc.column) == (line, column), err.message[:200]
    formatted = err.format()
    assert len(formatted) < 2000 and all(len(x) <= 700 for x in formatted.splitlines()), len(formatted)
    lines = formatted.splitlines()
    shown = next(i for i, x in enumerate(lines) if x.startswith(f"{line} | "))
    at = lines[shown + 1].index("^") - lines[shown + 1].index("|") - 2
    assert lines[shown][len(f"{line} | "):][at] == marker[0]


# ---- machine files: the same classes, in the machine loader ------------------------------------------
MACHINE = """\
name: tiny
device:
  name: test
  kind: cpu
  peak_tflops: {fp32: 10}
  memory_bandwidth_gb_per_s: 100
  sm_count: 8
kernel_launch_us: 4
comm_launch_us: 10
host_link: {latency_us: 1, bandwidth_gb_per_s: 25}
transports:
  nccl: {latency_us: 5, bandwidth_gb_per_s: 200}
chunk_bytes: 524288
compute_noise: {stalls_per_s: 2, stall_us: 300}
topology:
  nodes: 1
  gpus_per_node: 2
  vertices: {sw: nvswitch, cpu0: cpu}
  links:
    - {kind: nvlink, bandwidth_gb_per_s: 300, latency_us: 1, between: [[gpu0, sw], [gpu1, sw]]}
    - {kind: pcie, bandwidth_gb_per_s: 25, latency_us: 1, between: [[gpu0, cpu0], [gpu1, cpu0]]}
"""
"""A valid machine; each row of MACHINE_CASES replaces one text in it."""

MACHINE_CASES = [
    # YAML the safe constructor cannot build
    ("int_empty", "sm_count: 8", 'sm_count: !!int ""', 'invalid YAML value: "" is not a valid !!int', 7, 13),
    ("bool_maybe", "sm_count: 8", "sm_count: !!bool maybe", "maybe is not a valid !!bool", 7, 13),
    ("float_empty", "kernel_launch_us: 4", 'kernel_launch_us: !!float ""', 'is not a valid !!float', 8, 19),
    ("bad_timestamp", "name: tiny", "name: !!timestamp 2020-99-99", "is not a valid !!timestamp", 1, 7),
    ("unknown_tag", "name: tiny", "name: !foo bar", "could not determine a constructor for the tag '!foo'", 1, 7),
    ("too_deep", "name: tiny", "name: " + "[" * 3000 + "]" * 3000, "nests lists and mappings more than 64 deep", 1, 70),
    ("too_deep_mapping", "name: tiny", "name: " + "{a: " * 3000 + "1" + "}" * 3000, "more than 64 deep", 1, 259),
    # overflow, infinity, NaN
    ("int_past_float", "kernel_launch_us: 4", "kernel_launch_us: 1" + "0" * 400, "kernel_launch_us must be a finite number, got 1000", 8, 19),
    ("nan_latency", "latency_us: 5", "latency_us: .nan", "transports.nccl.latency_us must be a finite number, got .nan", 12, 22),
    ("inf_noise", "stall_us: 300", "stall_us: .inf", "compute_noise.stall_us must be a finite number, got .inf", 14, 44),
    ("inf_rate_where_finite", "stalls_per_s: 2", "stalls_per_s: .inf", "compute_noise.stalls_per_s must be a finite number", 14, 31),
    # what a machine may give (docs/limits.md)
    ("noise_stall_limit", "stall_us: 300", "stall_us: 1.0e+300", "compute_noise.stall_us is 1.0e+300, above the limit of 1e+09", 14, 44),
    ("noise_rate_limit", "stalls_per_s: 2", "stalls_per_s: 1.0e+300", "compute_noise.stalls_per_s is 1.0e+300, above the limit of 1e+06",
     14, 31),
    ("stretch_limit", "stall_us: 300}", "stall_us: 300, duration_stretch: 1.0e+9}", "duration_stretch is 1.0e+9, above the limit of 1000",
     14, 67),
    ("latency_limit", "latency_us: 5", "latency_us: 1.0e+300", "transports.nccl.latency_us is 1.0e+300, above the limit of 1e+09", 12, 22),
    ("launch_limit", "kernel_launch_us: 4", "kernel_launch_us: 1.0e+12", "kernel_launch_us is 1.0e+12, above the limit", 8, 19),
    ("bandwidth_floor", "bandwidth_gb_per_s: 200", "bandwidth_gb_per_s: 1.0e-300", "bandwidth_gb_per_s is 1.0e-300, below the limit of 0.001",
     12, 45),
    ("tflops_floor", "fp32: 10", "fp32: 1.0e-300", "device.peak_tflops.fp32 is 1.0e-300, below the limit of 1e-06", 5, 23),
    ("memory_bandwidth_floor", "memory_bandwidth_gb_per_s: 100", "memory_bandwidth_gb_per_s: 0.0000001",
     "device.memory_bandwidth_gb_per_s is 0.0000001, below the limit", 6, 30),
    ("link_bandwidth_floor", "bandwidth_gb_per_s: 25, latency_us: 1, between: [[gpu0, cpu0]",
     "bandwidth_gb_per_s: 1.0e-9, latency_us: 1, between: [[gpu0, cpu0]", "topology.links[1].bandwidth_gb_per_s is 1.0e-9", 21, 40),
    ("chunk_limit", "chunk_bytes: 524288", "chunk_bytes: 1" + "0" * 30, "chunk_bytes is 1,000,000,000,000,000,000,000,000,000,000, above the limit", 13, 14),
    # scale: refused up front
    ("gpus_per_node_1e9", "gpus_per_node: 2", "gpus_per_node: 1000000000", "topology.gpus_per_node is 1,000,000,000, above the limit of 65,536",
     17, 18),
    ("nodes_times_gpus", "nodes: 1", "nodes: 40000", "topology: 40,000 nodes x 2 GPUs = 80,000 devices, above the limit of 65,536", 16, 3),
    ("devices_1e9", "name: tiny", "name: tiny\ndevices: 1000000000", "devices is 1,000,000,000, above the limit", 2, 10),
    ("sm_count_huge", "sm_count: 8", "sm_count: 1" + "0" * 20, "device.sm_count is 100,000,000,000,000,000,000, above the limit of 1,048,576", 7, 13),
    # what the simulator adds to a topology
    ("implied_link_kind", "{kind: pcie, bandwidth_gb_per_s: 25", "{kind: shm, bandwidth_gb_per_s: 25",
     "topology.links[1].kind: 'shm' is implied by the topology, not a link to declare", 21, 14),
    ("host_memory_floor", "nodes: 1", "nodes: 1\n  host_memory_bandwidth_gb_per_s: 1.0e-9",
     "topology.host_memory_bandwidth_gb_per_s is 1.0e-9, below the limit of 0.001", 17, 35),
    ("copy_engines_zero", "nodes: 1", "nodes: 1\n  copy_engines: 0", "topology.copy_engines must be at least 1, got 0", 17, 17),
    ("peer_access_word", "nodes: 1", "nodes: 1\n  peer_access: nobody",
     "topology.peer_access must be 'all', 'none' or a list of GPU groups, got 'nobody'", 17, 16),
    # the user's text, not Python's reprs
    ("text_number", "kernel_launch_us: 4", "kernel_launch_us: 4e0", "kernel_launch_us must be a number, got '4e0'", 8, 19,
     "YAML reads 1e12 as text; write 1.0e+12"),
    ("word_for_number", "bandwidth_gb_per_s: 200", "bandwidth_gb_per_s: fast",
     "transports.nccl.bandwidth_gb_per_s must be a number, got 'fast'", 12, 45, NO_HINT),
    ("mapping_for_number", "kernel_launch_us: 4", "kernel_launch_us: {a: 1}", "kernel_launch_us must be a number, got a mapping", 8, 19),
    # misspelled keys and names: did you mean?
    ("misspelled_device_key", "memory_bandwidth_gb_per_s: 100", "memory_bandwith_gb_per_s: 100",
     "device: unknown key 'memory_bandwith_gb_per_s' (known: name, peak_tflops, memory_bandwidth_gb_per_s, sm_count, kind, memory_gib)",
     6, 3, "did you mean 'memory_bandwidth_gb_per_s'?"),
    ("misspelled_top_key", "kernel_launch_us: 4", "kernel_lanch_us: 4", "the machine: unknown key 'kernel_lanch_us'", 8, 1,
     "did you mean 'kernel_launch_us'?"),
    ("misspelled_link_key", "{kind: nvlink, bandwidth_gb_per_s: 300", "{kind: nvlink, bandwith_gb_per_s: 300",
     "topology.links[0]: unknown key 'bandwith_gb_per_s' (known: kind, bandwidth_gb_per_s, latency_us, between, line_rate_gb_per_s)", 20, 22,
     "did you mean 'bandwidth_gb_per_s'?"),
    ("misspelled_transport", "nccl: {latency_us: 5", "ncl: {latency_us: 5", "transports: unknown transport 'ncl' (known: nccl, gloo, memcpy)",
     12, 3, "did you mean 'nccl'?"),
    ("misspelled_dtype", "fp32: 10", "fp23: 10", "device.peak_tflops: unknown dtype 'fp23'", 5, 17, "did you mean 'fp32'?"),
    ("misspelled_collective", "bandwidth_gb_per_s: 200}", "bandwidth_gb_per_s: 200, collectives: {allreduce: {latency_us: 1, bandwidth_gb_per_s: 2}}}",
     "transports.nccl.collectives: unknown collective 'allreduce'", 12, 64, "did you mean 'all_reduce'?"),
    ("misspelled_reduce_op", "bandwidth_gb_per_s: 200}", ("bandwidth_gb_per_s: 200, collectives: {all_reduce: {latency_us: 1, "
     "bandwidth_gb_per_s: 2, measured_ranks: 2, measured_us: [[4, 1], [8, 2]], measured_us_by_op: {mx: {fp32: [[4, 1], [8, 2]]}}}}}"),
     "transports.nccl.collectives.all_reduce.measured_us_by_op: reduce op 'mx' has no place here", 12, 185, "did you mean 'max'?"),
    # YAML syntax: noticed after the cause, which the message names
    ("yaml_unclosed_mapping", "bandwidth_gb_per_s: 25}", "bandwidth_gb_per_s: 25",
     "(while parsing a flow mapping that starts at 10:12)", 11, 11),
]  # fmt: skip


@pytest.mark.parametrize("row", MACHINE_CASES, ids=[c[0] for c in MACHINE_CASES])
def test_bad_machine(row):
    from commdsl.errors import MachineError
    from commdsl.machine import load_machine_text

    _, old, new, message, line, column, *rest = row  # a 7th item: the hint (as `Case.hint`)
    hint = rest[0] if rest else None
    assert MACHINE.count(old) == 1
    text = MACHINE.replace(old, new)
    with pytest.raises(MachineError) as info:
        load_machine_text(text, "bad_machine.yaml")
    err = info.value
    formatted = err.format()
    assert message in err.message, formatted
    assert (err.loc.file, err.loc.line, err.loc.column) == ("bad_machine.yaml", line, column), formatted
    assert len(formatted) < 2000 and not PYTHON_REPRS.search(formatted), formatted
    if hint == NO_HINT:
        assert err.hint is None, formatted
    elif hint is not None:
        assert err.hint is not None and hint in err.hint, formatted


def test_the_machine_table_starts_from_a_valid_machine():
    from commdsl.machine import load_machine_text

    assert load_machine_text(MACHINE, "tiny.yaml").num_devices == 2


# `torchrun -m commdsl.run --values FILE`: the same YAML reader, so the same errors.
VALUES_CASES = [
    ('x: !!int ""\n', 'invalid YAML value: "" is not a valid !!int', 1, 4),
    ("x: {0: [1, !!float x]}\n", "x is not a valid !!float", 1, 12),
    ("x: " + "[" * 100 + "]" * 100 + "\n", "nests lists and mappings more than 64 deep", 1, 67),
    (b"x: {0: [1, 2]} # caf\xe9\n", "the values file is not UTF-8 text", 1, 21),
]


@pytest.mark.parametrize("text, message, line, column", VALUES_CASES)
def test_bad_values_file(text, message, line, column, tmp_path):
    from commdsl.run.check import load_values

    path = tmp_path / "values.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError) as info:
        load_values(str(path))
    err = info.value
    assert message in err.message and (err.loc.line, err.loc.column) == (line, column), err.format()


# A simulation whose ops end past the horizon (docs/limits.md): every value is within its
# limit, but the machine is so slow that an op ends decades later; the error names it.
SLOW_MACHINE = """\
name: slow
devices: 2
device: {name: x, peak_tflops: {fp32: 0.000001}, memory_bandwidth_gb_per_s: 0.001, sm_count: 1}
kernel_launch_us: 4
comm_launch_us: 10
host_link: {latency_us: 2, bandwidth_gb_per_s: 0.001}
transports:
  nccl: {latency_us: 4, bandwidth_gb_per_s: 0.001}
"""
HORIZON_CASES = [
    ("collective", ["compute F 1ms", "all_reduce g 1000TiB", "compute G 1ms"], "all_reduce g (op 0:1) ends at", 2),
    ("flops", ["compute F 1ms", "compute G 1e20FLOP"], "compute G (op 0:1) ends at", 2),
    ("copy", ["copy c 1000TiB to host"], "copy c (op 0:0) ends at", 1),
    ("p2p", ["if rank == 0:", "    send x 1000TiB to 1", "else:", "    recv x 1000TiB from 0"], "send x (op 0:0) ends at", 2),
]


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("case_id, lines, message, line", HORIZON_CASES, ids=[c[0] for c in HORIZON_CASES])
def test_simulated_time_past_the_horizon_names_the_op(case_id, lines, message, line, network):
    from commdsl.machine import load_machine_text
    from commdsl.sim import simulate

    text = "world: 2\nprogram: |\n" + "".join(f"  {x}\n" for x in lines)
    program = load_schedule_text(text, "slow.yaml")
    with pytest.raises(LimitError) as info:
        simulate(program, load_machine_text(SLOW_MACHINE, "slow.yaml"), network)
    err = info.value
    assert message in err.message and "past the simulator's horizon of 1e+06s" in err.message, err.format()
    assert err.loc.line == 2 + line


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


# Schedules within the limits that a loop's bound must not refuse (each would, if the bound
# took what the first iteration makes, or the values at the loop's start, for every
# iteration): (id, program lines, ops over the 4 ranks). Loaded with --max-ops 5000.
WITHIN_LIMITS = [
    ("bound_changed_in_the_body", ["m = 1000", "for i in range(100):", "    for j in range(m):", "        compute F 1us", "    m = 0"],
     4000),
    ("bound_from_the_loop_variable", ["for i in range(100):", "    for j in range(1000 - 1000 * i):", "        compute F 1us"],
     4000),
    ("first_iteration_only", ["for i in range(100):", "    if i == 0:", "        for j in range(1000):", "            compute F 1us"],
     4000),
    ("block_redefined_by_a_block", ["def g():", "    for j in range(1000):", "        compute F 1us", "def f():",
                                    "    def g():", "        pass", "for i in range(100):", "    g()", "    f()"], 4000),
    ("block_redefined_in_the_loop", ["def g():", "    for j in range(1000):", "        compute F 1us", "for i in range(100):",
                                     "    g()", "    def g():", "        pass"], 4000),
]  # fmt: skip


@pytest.mark.parametrize("case_id, lines, ops", WITHIN_LIMITS, ids=[c[0] for c in WITHIN_LIMITS])
def test_loop_bounds_never_refuse_a_schedule_within_the_limits(case_id, lines, ops):
    assert load_schedule_text(prog(*lines), "ok.yaml", max_ops=5000).num_ops == ops


def test_giant_loop_fails_fast():
    start = time.perf_counter()
    with pytest.raises(LimitError):
        load_schedule_text(prog("for i in range(10**12):", "    compute F 1ms"), "bad.yaml")
    with pytest.raises(LimitError):
        load_schedule_text(prog("for i in range(10**15):", "    for j in range(10**15):", "        pass"), "bad.yaml")
    # Checked before expanding: evaluated one by one, these loops would never end (the bound is
    # generous, so that a busy machine cannot fail it).
    assert time.perf_counter() - start < 30.0


def test_a_loop_past_the_op_limit_counts_the_branch_its_ifs_take():
    """An `if` whose condition the loop does not change takes one branch on every pass:
    the bound before the loop counts that branch's ops (1F1B's steady loop: 6 a pass on
    rank 0, where the least over `if not last:` and nothing gave 4), so the schedule is
    refused at the loop, before millions of ops are made."""
    from commdsl.dsl import load_schedule
    with pytest.raises(LimitError) as info:
        load_schedule("1f1b", {"microbatches": "1048576"})
    assert "this loop would add at least 6,291,438 (1,048,573 iterations of at least 6 each)" in info.value.message


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


def test_a_negative_zero_amount_is_kept_as_zero():
    """`1GFLOP * -0.0` passes the sign check; the op holds 0, not -0 (shown as `-0FLOP`)."""
    ops = load_schedule_text("world: 1\nprogram: |\n  compute c 1GFLOP * -0.0 dtype=fp32\n  compute d 1ms * -0.0\n").ops[0]
    assert [str(op.spec.flops) for op in ops if op.spec.flops is not None] == ["0.0"]
    assert [str(op.spec.duration_us) for op in ops if op.spec.duration_us is not None] == ["0.0"]
