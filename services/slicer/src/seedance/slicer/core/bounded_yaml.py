"""YAML documents that arrive over the bus, loaded within bounds, and values quoted within bounds.

This module owns the one YAML loader the slicer uses for text someone else wrote (the quota
policy in KV ``seedance-policy``, written by the k8s-bridge or an operator) and the bounded
repr its error messages quote values through. It must not know any document's schema.

Why each bound:
- no anchors or aliases: PyYAML builds an alias as a shared reference, so a 432-byte document
  of nine levels of nine aliases loads cheaply, but anything that walks it (a repr in an error
  message, a comparison, a dump) walks 9**9 leaves: ~12.7 GB of text, a MemoryError that took
  down every slicer reading the key. No document Seedance writes uses them (the bridge writes
  JSON), so they are refused outright rather than counted;
- nesting depth: the composer recurses per level, so a few kilobytes of ``[[[[...`` raise
  RecursionError (not a YAMLError) past ~330 levels; the quota format is 5 levels deep;
- size: time to parse is linear in size (pure-Python loader: 0.56 s for a generated 1,000-tenant
  JSON quota document of 251 KB, one `yaml.safe_load` timed with `time.perf_counter`,
  2026-12-07 13:12 UTC, load average 2.15 on 2 shared cores), and a value larger than NATS's
  default ``max_payload`` (1 MiB) is not one a bucket holds unless an operator raised it.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

__all__ = ["MAX_DEPTH", "MAX_DOC_BYTES", "DocumentError", "bounded_name", "bounded_repr", "load"]

MAX_DOC_BYTES = 1024 * 1024
MAX_DEPTH = 32

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def bounded_repr(value: object) -> str:
    """`repr(value)` cut short (at most a few hundred characters whatever `value` holds): what an
    error message quotes of a value it did not expect."""
    return _repr.repr(value)


def bounded_name(value: object, limit: int = 80) -> str:
    """`str(value)` (a key of the document, named in a field's path) cut to `limit` characters."""
    text = str(value) if isinstance(value, str | int) else bounded_repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class DocumentError(ValueError):
    """The text is not a YAML document within the bounds; the message (a predicate: "is not
    valid YAML: ...") says which one, for the caller to name the document."""


class _BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml ships no types
    """SafeLoader that refuses anchors and aliases and nests at most `MAX_DEPTH` levels."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases are not accepted", event.start_mark
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(data: bytes | str) -> Any:
    """The one document in `data`, as plain values (dicts, lists, scalars).

    Raises:
        DocumentError: larger than `MAX_DOC_BYTES`, not UTF-8, not YAML, or holding an anchor,
            an alias or more than `MAX_DEPTH` levels of nesting.
    """
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_DOC_BYTES:
        raise DocumentError(f"is {size} bytes, over the limit of {MAX_DOC_BYTES}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"is not UTF-8: {exc}") from None
    loader = _BoundedLoader(data)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise DocumentError(f"is not valid YAML: {exc}") from None
    except ValueError as exc:  # a constructor's: an integer of over 4,300 digits
        raise DocumentError(
            f"holds a value YAML cannot construct: {bounded_repr(str(exc))}"
        ) from None
    finally:
        loader.dispose()
