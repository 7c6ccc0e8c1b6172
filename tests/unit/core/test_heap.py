"""seedance.core.heap: the survivors of a full collection are frozen, nothing else changes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from seedance.core import heap
from seedance.core.heap import freeze_survivors, stop_freezing_survivors


@pytest.fixture
def freezing() -> Iterator[None]:
    gc.unfreeze()
    freeze_survivors()
    try:
        yield
    finally:
        stop_freezing_survivors()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_full_collection_freezes_its_survivors(freezing: None) -> None:
    live = [_Node() for _ in range(100)]
    gc.collect()
    assert gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    # The frozen objects are out of the next full collection's walk: generation 2 (the walk's
    # old part) is empty right after the freeze, and stays so until young objects survive.
    assert gc.get_objects(generation=2) == []
    assert frozen >= len(live)
    assert all(n.other is None for n in live)


def test_a_young_collection_freezes_nothing(freezing: None) -> None:
    gc.collect(1)
    assert gc.get_freeze_count() == 0


def test_garbage_outside_cycles_is_still_freed_once_frozen(freezing: None) -> None:
    import weakref

    obj = _Node()
    ref = weakref.ref(obj)
    gc.collect()  # obj survives, frozen
    del obj  # reference counting frees it, frozen or not
    assert ref() is None


def test_cycles_born_after_the_freeze_are_collected(freezing: None) -> None:
    import weakref

    gc.collect()
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    gc.collect()
    assert ref() is None


def test_installing_twice_installs_once_and_stopping_unfreezes() -> None:
    gc.unfreeze()
    freeze_survivors()
    freeze_survivors()
    try:
        assert gc.callbacks.count(heap._after_collection) == 1
        gc.collect()
        assert gc.get_freeze_count() > 0
    finally:
        stop_freezing_survivors()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() == 0
