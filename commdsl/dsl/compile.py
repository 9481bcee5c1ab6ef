"""Compile the Lark tree of a program into closures, once; run them once per rank.

`ProgramCompiler` is a Lark Transformer with one method per grammar rule, assembled from
three rule sets, one module each: statements (commdsl/dsl/compile_statements.py), op
statements (compile_ops.py) and expressions (compile_expressions.py), on a shared base
(compile_base.py). Expressions become `Expr` callables `(env) -> value`; statements
become `Stmt` callables `(rank_expander, env) -> None`. Running closures is several
times faster than walking the tree for every rank, and it keeps the tree out of
everything past the compiler.

Everything that can be checked without a rank is checked at compile time: unknown
options, enum values, group and stream names. The closures are also where the fast path
starts: each op statement carries a `*Site` (its constants and a cache of the op specs
it has made, see commdsl/dsl/expand.py), refs cache their texts, and integer arithmetic
skips the unit machinery, so a rank's expansion costs little more than making its ops.
"""

from __future__ import annotations

from lark import Tree, v_args
from lark.exceptions import VisitError

from commdsl.dsl.compile_expressions import ExpressionRules
from commdsl.dsl.compile_ops import OpRules
from commdsl.dsl.compile_statements import StatementRules
from commdsl.errors import CommdslError, LimitError, SourceLoc


@v_args(meta=True)
class ProgramCompiler(StatementRules, OpRules, ExpressionRules):
    """Transformer from the program's Lark tree to closures: `compile(tree)`."""

    def compile(self, tree: Tree, param_values: dict[str, object] | None = None):
        """Transform `tree` into closures; errors raised by rule methods come out as
        they are (Lark wraps them in `VisitError`). `param_values`: the params' values,
        which make the params no block parameter shadows constants (`constants`)."""
        self.block_names = frozenset(str(node.children[0]) for node in tree.find_data("def_stmt"))
        if param_values:
            shadowed = {str(name) for node in tree.find_data("parameters") for name in node.children}
            self.constants = {name: value for name, value in param_values.items() if name not in shadowed}
        try:
            return self.transform(tree)
        except VisitError as err:
            if isinstance(err.orig_exc, CommdslError):
                raise err.orig_exc from None
            if isinstance(err.orig_exc, RecursionError):
                raise _too_deep(self.origin.loc(1, 1)) from None
            raise
        except RecursionError:
            raise _too_deep(self.origin.loc(1, 1)) from None


def _too_deep(loc: SourceLoc) -> LimitError:
    return LimitError("the program nests too deeply (expressions or blocks)", loc,
                      hint="split deeply nested expressions into assignments")  # fmt: skip
