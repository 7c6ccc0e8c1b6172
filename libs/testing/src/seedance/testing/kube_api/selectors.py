"""Label and field selectors as the API server parses them from ``labelSelector`` and
``fieldSelector``: pure functions from a selector string to a predicate over an object (a dict).

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``.
Field selectors: ``f=v``, ``f==v``, ``f!=v`` on the fields in ``FIELDS`` (the real server also
serves only a per-kind list; an unknown field is a 400 there as here). It must not know about
HTTP or the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FIELDS", "Selector", "SelectorError", "field_value", "parse_fields", "parse_labels"]

#: The field selectors served (kubectl describe uses involvedObject.*; the bridge spec.* and
#: status.phase).
FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.schedulerName",
        "spec.unschedulable",
        "status.phase",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "involvedObject.kind",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "type",
        "source",
        "regarding.name",
        "regarding.namespace",
        "regarding.uid",
        "regarding.kind",
    }
)

Predicate = Callable[[dict[str, Any]], bool]


class SelectorError(ValueError):
    """A selector that does not parse or names a field that is not served."""


@dataclass(frozen=True)
class Selector:
    """Both selectors of one request; the empty selector matches everything."""

    predicates: tuple[Predicate, ...] = ()

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(p(obj) for p in self.predicates)

    def __and__(self, other: Selector) -> Selector:
        return Selector(self.predicates + other.predicates)

    @property
    def empty(self) -> bool:
        return not self.predicates


_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    terms: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t for t in terms if t.strip()]


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _label_term(term: str) -> Predicate:
    eq = _EQ_RE.match(term)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda o: _labels(o).get(key) != value
        return lambda o: _labels(o).get(key) == value
    m = _SET_RE.match(term)
    if not m:
        raise SelectorError(f"unable to parse requirement: {term!r}")
    neg, key, op, values = m.groups()
    if op is None:
        if neg:
            return lambda o: key not in _labels(o)
        return lambda o: key in _labels(o)
    if neg:
        raise SelectorError(f"unable to parse requirement: {term!r}")
    allowed = frozenset(v.strip() for v in values.split(",") if v.strip())
    if op == "in":
        return lambda o: _labels(o).get(key) in allowed
    return lambda o: _labels(o).get(key) not in allowed


def parse_labels(text: str | None) -> Selector:
    if not text:
        return Selector()
    return Selector(tuple(_label_term(t) for t in _split_terms(text)))


def field_value(obj: dict[str, Any], path: str) -> str:
    """A field as the server compares it: a string; a missing field is ``""``."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, dict):  # events' ``source`` is {component, host}
        return str(node.get("component", ""))
    return str(node)


def _field_term(term: str) -> Predicate:
    m = _EQ_RE.match(term)
    if not m:
        raise SelectorError(f"invalid selector: {term!r}; can't understand {term!r}")
    key, op, value = m.groups()
    if key not in FIELDS:
        raise SelectorError(f'field label not supported: "{key}"')
    if op == "!=":
        return lambda o: field_value(o, key) != value
    return lambda o: field_value(o, key) == value


def parse_fields(text: str | None) -> Selector:
    if not text:
        return Selector()
    return Selector(tuple(_field_term(t) for t in _split_terms(text)))
