"""Values of the op language: numbers, booleans and quantities with units.

Quantities are dimension-checked: a size plus a duration, or a duration where a size
is expected, is an error the user sees with its source line, not a silent number.
Sizes are kept in bytes, durations in microseconds, work in FLOPs.

Operations here raise `ValueFault` (no location); the compiler adds the location.
"""

from __future__ import annotations

import enum
import math
import re

from commdsl.ir import Dtype


class Unit(str, enum.Enum):
    SIZE = "size"
    DURATION = "duration"
    WORK = "work"


# suffix -> (unit, multiplier to the canonical unit: bytes, microseconds, FLOPs)
UNIT_SUFFIXES: dict[str, tuple[Unit, float]] = {
    "B": (Unit.SIZE, 1), "KB": (Unit.SIZE, 1e3), "MB": (Unit.SIZE, 1e6),
    "GB": (Unit.SIZE, 1e9), "TB": (Unit.SIZE, 1e12), "KiB": (Unit.SIZE, 2**10),
    "MiB": (Unit.SIZE, 2**20), "GiB": (Unit.SIZE, 2**30), "TiB": (Unit.SIZE, 2**40),
    "ns": (Unit.DURATION, 1e-3), "us": (Unit.DURATION, 1), "ms": (Unit.DURATION, 1e3),
    "s": (Unit.DURATION, 1e6), "FLOP": (Unit.WORK, 1), "KFLOP": (Unit.WORK, 1e3),
    "MFLOP": (Unit.WORK, 1e6), "GFLOP": (Unit.WORK, 1e9), "TFLOP": (Unit.WORK, 1e12),
    "PFLOP": (Unit.WORK, 1e15),
}  # fmt: skip

QUANTITY_LITERAL = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?(" + "|".join(sorted(UNIT_SUFFIXES, key=len, reverse=True)) + ")")
"""A quantity literal as the grammar's QUANTITY token reads it (to be used with fullmatch)."""
_QUANTITY_RE = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]+)\s*$", re.ASCII)


INT_LIMIT = 2**63
"""Integers must stay below this in magnitude: a schedule has no use for larger ones,
and unbounded integers would let `x = x * x` in a loop exhaust memory."""


class ValueFault(Exception):
    """A type or value error without a location; the caller attaches one."""


def checked_int(v: int) -> int:
    """`v` if it is within `INT_LIMIT`, else a `ValueFault`."""
    if -INT_LIMIT < v < INT_LIMIT:
        return v
    raise ValueFault(f"integer result out of range (more than 2**63 in magnitude, {len(str(abs(v)))} digits)")


def checked_float(v: float) -> float:
    """`v` if it is a finite number, else a `ValueFault` (overflow to inf, or nan)."""
    if math.isfinite(v):
        return v
    raise ValueFault("arithmetic overflow: the result is not a finite number")


def _checked(v):
    if type(v) is int:
        return checked_int(v)
    if type(v) is float:
        return checked_float(v)
    return v


def quantity_value(v: float, unit: Unit) -> float:
    """A quantity's value, normalised: finite (else a `ValueFault`); a whole size that
    fits in 64 bits is an int (bytes are counted exactly), anything larger a float, so
    no arithmetic on sizes builds integers beyond float range."""
    if type(v) is int:
        if -INT_LIMIT < v < INT_LIMIT:
            return v
        try:
            v = float(v)
        except OverflowError:
            raise ValueFault("arithmetic overflow: the result is not a finite number") from None
    checked_float(v)
    if unit is Unit.SIZE and v.is_integer() and -INT_LIMIT < v < INT_LIMIT:
        return int(v)
    return v


class Quantity:
    """A number with a unit. `dtype` is kept only for sizes written as `bf16[n]`."""

    __slots__ = ("value", "unit", "dtype")

    def __init__(self, value: float, unit: Unit, dtype: Dtype | None = None):
        self.value = value
        self.unit = unit
        self.dtype = dtype

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.unit is self.unit and other.value == self.value

    def __hash__(self) -> int:
        return hash((self.value, self.unit))

    def __repr__(self) -> str:
        return format_value(self)


def parse_quantity(text: str) -> Quantity:
    """Parse a literal such as "32MiB" or "1.5 ms"."""
    m = _QUANTITY_RE.match(text)
    if not m or m.group(2) not in UNIT_SUFFIXES:
        raise ValueFault(f"not a quantity: {text!r} (expected a number with a unit such as 32MiB, 2ms, 4GFLOP)")
    unit, mult = UNIT_SUFFIXES[m.group(2)]
    value = float(m.group(1)) * mult
    if not math.isfinite(value):
        raise ValueFault(f"quantity {text.strip()} is too large")
    return Quantity(quantity_value(value, unit), unit)


def type_name(v: object) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, Quantity):
        return f"a {v.unit.value} ({format_value(v)})"
    return type(v).__name__


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scale(q: Quantity, k: float) -> Quantity:
    return Quantity(q.value * k, q.unit, q.dtype)


def _same_dtype(a: Quantity, b: Quantity) -> Dtype | None:
    """The element type of a sum of two sizes: kept only when both agree."""
    return a.dtype if a.dtype is b.dtype else None


def binary(op: str, a: object, b: object) -> object:
    """Arithmetic `a op b` with units checked. op is one of + - * / // % **."""
    result = _binary(op, a, b)
    if isinstance(result, Quantity):
        result.value = quantity_value(result.value, result.unit)
        return result
    return _checked(result)


def _power(a: object, b: object) -> object:
    if not (is_number(a) and is_number(b)):
        raise ValueFault(f"cannot compute {type_name(a)} ** {type_name(b)}; ** takes plain numbers")
    if a == 0 and b < 0:
        raise ValueFault("division by zero (0 raised to a negative power)")
    if type(a) is int and type(b) is int and b >= 0:
        # Bound the result's size before computing it: 10 ** 10 ** 10 must not hang.
        if abs(a) > 1 and b * math.log2(abs(a)) > 64:
            raise ValueFault(f"integer result out of range: {a} ** {b} has more than 64 bits")
        return a**b
    try:
        result = float(a) ** float(b)
    except OverflowError:
        raise ValueFault("arithmetic overflow: the result is not a finite number") from None
    if isinstance(result, complex):
        raise ValueFault(f"({format_value(a)}) ** {format_value(b)} is not a real number")
    return result


def _binary(op: str, a: object, b: object) -> object:
    if op == "**":
        return _power(a, b)
    if is_number(a) and is_number(b):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            raise ValueFault("division by zero")
        if op == "/":
            return a / b
        if op == "//":
            return a // b
        return a % b
    qa, qb = isinstance(a, Quantity), isinstance(b, Quantity)
    if qa and qb and a.unit is b.unit:
        if op == "+":
            return Quantity(a.value + b.value, a.unit, _same_dtype(a, b))
        if op == "-":
            return Quantity(a.value - b.value, a.unit, _same_dtype(a, b))
        if op in ("/", "//", "%"):
            if b.value == 0:
                raise ValueFault("division by zero")
            if op == "/":
                return a.value / b.value
            if op == "//":
                return int(a.value // b.value)
            return Quantity(a.value % b.value, a.unit, _same_dtype(a, b))
    if op == "*" and qa and is_number(b):
        return _scale(a, b)
    if op == "*" and qb and is_number(a):
        return _scale(b, a)
    if op in ("/", "//") and qa and is_number(b):
        if b == 0:
            raise ValueFault("division by zero")
        return Quantity(a.value // b if op == "//" else a.value / b, a.unit, a.dtype)
    raise ValueFault(f"cannot compute {type_name(a)} {op} {type_name(b)}")


def negate(a: object) -> object:
    if is_number(a):
        return _checked(-a)
    if isinstance(a, Quantity):
        return Quantity(-a.value, a.unit, a.dtype)
    raise ValueFault(f"cannot negate {type_name(a)}")


def compare(op: str, a: object, b: object) -> bool:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        if a.unit is not b.unit:
            raise ValueFault(f"cannot compare {type_name(a)} with {type_name(b)}")
        a, b = a.value, b.value
    elif isinstance(a, bool) and isinstance(b, bool):
        if op not in ("==", "!="):
            raise ValueFault(f"cannot order booleans with {op}")
    elif not (is_number(a) and is_number(b)):
        raise ValueFault(f"cannot compare {type_name(a)} with {type_name(b)}")
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


def truth(v: object, what: str) -> bool:
    if isinstance(v, bool):
        return v
    raise ValueFault(f"{what} must be true or false, got {type_name(v)}; compare explicitly, e.g. `x > 0`")


def _same_kind(name: str, args: tuple) -> None:
    if not args:
        raise ValueFault(f"{name}() needs at least one argument")
    units = {a.unit if isinstance(a, Quantity) else ("number" if is_number(a) else type_name(a)) for a in args}
    if len(units) > 1:
        raise ValueFault(f"{name}() arguments must be of one kind, got " + ", ".join(type_name(a) for a in args))


def _key(v: object) -> float:
    return v.value if isinstance(v, Quantity) else v  # type: ignore[return-value]


def _fn_min(*args):
    _same_kind("min", args)
    return min(args, key=_key)


def _fn_max(*args):
    _same_kind("max", args)
    return max(args, key=_key)


def _one_number(name: str, args: tuple) -> float:
    if len(args) != 1 or not is_number(args[0]):
        got = ", ".join(type_name(a) for a in args) or "nothing"
        raise ValueFault(f"{name}() takes one number, got {got}")
    return args[0]


def _to_int(name: str, args: tuple, fn) -> int:
    x = _one_number(name, args)
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueFault(f"{name}() of {x}: not a finite number")
    return checked_int(fn(x))


def _fn_log2(*args):
    x = _one_number("log2", args)
    if x <= 0:
        raise ValueFault(f"log2() of {x}: the argument must be positive")
    return math.log2(x)


def _fn_abs(*args):
    if len(args) == 1 and isinstance(args[0], Quantity):
        return Quantity(abs(args[0].value), args[0].unit, args[0].dtype)
    return abs(_one_number("abs", args))


BUILTINS = {
    "min": _fn_min,
    "max": _fn_max,
    "ceil": lambda *a: _to_int("ceil", a, math.ceil),
    "floor": lambda *a: _to_int("floor", a, math.floor),
    "log2": _fn_log2,
    "abs": _fn_abs,
    "int": lambda *a: _to_int("int", a, int),
    "float": lambda *a: float(_one_number("float", a)),
}
"""Pure functions callable from expressions. `rank_at` is bound per program (mesh)."""


def format_value(v: object) -> str:
    """Human text for a value: sizes in the largest exact binary unit, times in the
    largest unit with a value >= 1."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Quantity):
        if v.unit is Unit.SIZE:
            return format_bytes(v.value)
        if v.unit is Unit.DURATION:
            return format_us(v.value)
        return format_flops(v.value)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def format_bytes(n: float) -> str:
    if n < 0:  # a negative size the user wrote, for its message: -1MiB, not -1.04858e+06B
        return "-" + format_bytes(-n)
    if n >= 2**60:  # far past any buffer (the limit is 1024TiB): no unit makes it readable
        return f"{n:.3g}B"
    for suffix, mult in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= mult and (n / mult).is_integer():
            return f"{int(n // mult)}{suffix}"
    for suffix, mult in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= mult:
            return f"{n / mult:.3g}{suffix}"
    return f"{n:g}B"


def format_us(us: float, digits: int = 6) -> str:
    """A time in the largest unit that keeps it >= 1, with `digits` significant digits."""
    for suffix, mult in (("s", 1e6), ("ms", 1e3), ("us", 1.0)):
        if abs(us) >= mult:
            return f"{us / mult:.{digits}g}{suffix}"
    return f"{us * 1e3:.{digits}g}ns" if us else "0us"


def format_flops(f: float) -> str:
    if f < 0:
        return "-" + format_flops(-f)
    for suffix, mult in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if f >= mult:
            return f"{f / mult:.6g}{suffix}"
    return f"{f:g}FLOP"
