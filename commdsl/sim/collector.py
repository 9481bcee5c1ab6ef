"""The cyclic garbage collector paused or frozen for a block: the simulator and its
outputs allocate millions of small objects that live to the end and form no cycles, and
each collection would walk them all (a cost per op that grows with the program)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen() -> Iterator[None]:
    """Every object made so far out of the cyclic collector's walks for the block (in its
    permanent generation, `gc.freeze`), and back after; a caller's own freeze is left as
    it is (nothing is frozen or unfrozen then). For objects that live through the block
    and hold no garbage, such as a loaded program's millions of ops."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after. The engine
    allocates millions of small objects that live until the end of the run and form no
    garbage cycles; each collection would walk them all (a cost per op growing with the
    program's size)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
