"""Checks of the values a Python caller passes to commdsl's API (`commdsl.simulate`,
`commdsl.sweep`, `load_machine`, ...): a wrong type or value is a `CommdslError` naming the
argument and what it got, never a TypeError from deep inside."""

from __future__ import annotations

import enum
import math
import numbers
import os
from typing import TypeVar

from commdsl.errors import CommdslError, UsageError


def whole_number(name: str, value: object, minimum: int = 1, maximum: int | None = None,
                 error: type[CommdslError] = UsageError) -> int:
    """`value` as an int, where it is a whole number (an int, not a bool) from `minimum`
    (to `maximum`); else `error` naming `name` and the value. The one check of every count
    a Python caller passes: nodes, samples, max_ops, jobs."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be a whole number, got {describe(value)}")
    value = int(value)
    if maximum is not None and not minimum <= value <= maximum:
        raise error(f"{name} must be a whole number from {minimum:,} to {maximum:,}, got {value}")
    if value < minimum:
        raise error(f"{name} must be at least {minimum}, got {value}")
    return value


def path_text(function: str, name: str, value: object, takes: str) -> str:
    """`value` as a path's text, where it is a str or an `os.PathLike`; else a
    `UsageError` saying that `function`'s `name` is what it `takes` and what it got."""
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str):
            return text
    raise UsageError(f"{function}: {name} must be {takes}, got {describe(value)}")


def describe(value: object) -> str:
    """A value a caller passed, for an error message: plain values as written (their
    start only where long), anything else by its type."""
    if value is None or isinstance(value, (bool, numbers.Number, str)):
        text = repr(value)
        return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"
    return f"a {type(value).__name__}"


E = TypeVar("E", bound=enum.Enum)


def member(enum_type: type[E], value: object, what: str) -> E:
    """`value` (a member or its value) as a member of `enum_type`; else a `UsageError`
    naming `what` it is and the known values."""
    try:
        return enum_type(value)
    except ValueError:
        raise UsageError(f"unknown {what} {describe(value)} (known: {', '.join(str(m.value) for m in enum_type)})") from None


def is_amount(value: object) -> bool:
    """Whether `value` is a real number from 0 below infinity (not a bool, not NaN)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 <= value < math.inf
