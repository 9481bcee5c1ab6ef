"""Shared test helpers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from commdsl.errors import MachineError
from commdsl.machine import load_machine_text


@pytest.fixture
def machine_error() -> Callable[[str, str, str, int, int], MachineError]:
    """`machine_error(text, file, message, line, col)`: loading `text` as `file` fails with
    `message` at that line and column; returns the error."""

    def check(text: str, file: str, message: str, line: int, col: int) -> MachineError:
        with pytest.raises(MachineError) as info:
            load_machine_text(text, file)
        err = info.value
        assert message in err.message
        assert (err.loc.file, err.loc.line, err.loc.column) == (file, line, col)
        return err

    return check
