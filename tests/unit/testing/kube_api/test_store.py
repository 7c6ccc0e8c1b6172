"""The store: one revision counter, the bounded history, compaction's 410, watch replay and
the selector transitions a watcher sees, and the journal a restarted store replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from seedance.testing.kube_api.errors import ApiError
from seedance.testing.kube_api.selectors import Selector, parse_fields
from seedance.testing.kube_api.store import Journal, Store

PODS = ("", "pods")


def _pod(name: str, node: str = "", ns: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": node}}


def _drain(watcher: Any) -> list[tuple[str, str]]:
    out = []
    while watcher.items:
        kind, obj = watcher.items.popleft()
        out.append((kind, obj["metadata"]["name"]))
    return out


def test_every_write_takes_the_next_revision() -> None:
    store = Store()
    a = store.put(PODS, ("a", "x"), _pod("x"))
    b = store.put(PODS, ("a", "y"), _pod("y"))
    gone = store.remove(PODS, ("a", "x"))
    assert [a["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"]] == ["1", "2"]
    assert gone is not None
    assert gone["metadata"]["resourceVersion"] == "3"
    assert store.remove(PODS, ("a", "x")) is None
    assert store.rv == 3


def test_watch_replays_history_after_a_revision_for_its_resource_and_namespace() -> None:
    store = Store()
    store.put(PODS, ("a", "x"), _pod("x"))
    store.put(("", "nodes"), ("", "n"), {"metadata": {"name": "n"}})
    store.put(PODS, ("b", "y"), _pod("y", ns="b"))
    store.put(PODS, ("a", "z"), _pod("z"))
    watcher = store.watch(PODS, "a", Selector(), since=1)
    assert _drain(watcher) == [("ADDED", "z")]
    store.put(PODS, ("a", "x"), _pod("x", node="n1"))
    assert _drain(watcher) == [("MODIFIED", "x")]
    initial = store.watch(PODS, None, Selector(), since=None)
    assert _drain(initial) == [("ADDED", "x"), ("ADDED", "z"), ("ADDED", "y")]


def test_an_object_leaving_or_entering_the_selector_is_deleted_or_added() -> None:
    store = Store()
    store.put(PODS, ("a", "x"), _pod("x"))
    unbound = store.watch(PODS, None, parse_fields("spec.nodeName="), since=store.rv)
    store.put(PODS, ("a", "x"), _pod("x", node="n1"))
    store.put(PODS, ("a", "x"), _pod("x", node=""))
    store.remove(PODS, ("a", "x"))
    assert _drain(unbound) == [("DELETED", "x"), ("ADDED", "x"), ("DELETED", "x")]


def test_compaction_and_window_overflow_make_old_revisions_expire() -> None:
    store = Store(history_window=3)
    for i in range(5):
        store.put(PODS, ("a", f"p{i}"), _pod(f"p{i}"))
    assert store.floor == 2  # revisions 1 and 2 fell out of the window
    assert _drain(store.watch(PODS, None, Selector(), since=2)) == [
        ("ADDED", "p2"),
        ("ADDED", "p3"),
        ("ADDED", "p4"),
    ]
    with pytest.raises(ApiError) as caught:
        store.watch(PODS, None, Selector(), since=1)
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    assert store.compact() == 5
    with pytest.raises(ApiError):
        store.watch(PODS, None, Selector(), since=4)
    assert _drain(store.watch(PODS, None, Selector(), since=5)) == []


def test_a_journaled_store_comes_back_with_objects_revision_and_history(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state.jsonl")
    store = Store(journal=journal)
    store.put(PODS, ("a", "x"), _pod("x"))
    store.put(PODS, ("a", "y"), _pod("y"))
    store.remove(PODS, ("a", "x"))
    store.compact(1)
    journal.close()
    replayed = Journal(tmp_path / "state.jsonl")
    again = Store(journal=replayed)
    assert again.rv == 3
    assert again.floor == 1
    assert [o["metadata"]["name"] for o in again.select(PODS, None, Selector())] == ["y"]
    assert _drain(again.watch(PODS, None, Selector(), since=1)) == [
        ("ADDED", "y"),
        ("DELETED", "x"),
    ]
    assert again.put(PODS, ("a", "z"), _pod("z"))["metadata"]["resourceVersion"] == "4"
    replayed.close()


def test_a_write_built_from_the_stored_object_leaves_the_history_as_it_was() -> None:
    store = Store()
    first = store.put(PODS, ("a", "x"), _pod("x"))
    store.put(PODS, ("a", "x"), {**first, "status": {"phase": "Running"}})  # shares metadata
    assert first["metadata"]["resourceVersion"] == "1"
    replay = store.watch(PODS, None, Selector(), since=0)
    assert [(k, o["metadata"]["resourceVersion"]) for k, o in replay.items] == [
        ("ADDED", "1"),
        ("MODIFIED", "2"),
    ]
