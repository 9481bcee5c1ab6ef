"""Per-op medians over a sampled simulation's samples (`simulate(samples=N)`).

As Python, `medians` runs in C-level passes over the columns. Compiled (`medians.pxd`,
`commdsl.native`), three samples, the common case, take a C loop instead: the middle
value of each op's three, the one `sorted` puts in the middle.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import add, itemgetter, truediv

try:
    import cython

    COMPILED = cython.compiled
    """This module runs compiled (Cython reads `cython.compiled` as True when it builds it)."""
except ImportError:  # no Cython here: the module runs as Python
    COMPILED = False


def medians(columns: list[array]) -> array:
    """Per position, `statistics.median` of the columns' values there (the middle value;
    of an even count, the mean of the middle two). Columns the samples agree on (host issue
    times that no stall reached, for one) are their own median."""
    first = columns[0].tobytes()  # bytes compare in C (+0.0 and -0.0 differ: they take the long way)
    if all(column.tobytes() == first for column in columns):
        return array("d", columns[0])
    n = len(columns)
    mid = n // 2
    if n == 3 and COMPILED:
        out = array("d", columns[0])
        _middle_of_three(columns[0], columns[1], columns[2], out)
        return out
    if n % 2:
        return array("d", map(itemgetter(mid), map(sorted, zip(*columns))))
    if n == 2:  # the mean of both, in either order (a + b is b + a, bit for bit)
        return array("d", map(truediv, map(add, *columns), repeat(2)))
    ordered = list(map(sorted, zip(*columns)))
    return array("d", map(truediv, map(add, map(itemgetter(mid - 1), ordered), map(itemgetter(mid), ordered)), repeat(2)))


def _middle_of_three(a: array, b: array, c: array, out: array) -> None:
    """out[i] = sorted((a[i], b[i], c[i]))[1], the very value (of equal ones, the one a
    stable sort puts in the middle). A C loop where compiled; unused as Python."""
    for i in range(len(out)):
        x, y, z = a[i], b[i], c[i]
        lo, hi = (y, x) if y < x else (x, y)  # an equal pair keeps its order, as sorted's
        if z < lo:
            out[i] = lo
        elif z < hi:
            out[i] = z
        else:
            out[i] = hi
