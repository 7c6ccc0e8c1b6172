"""The JSON Schema of every event, as the text of ``proto/schemas/<tag>.json``, and its drift.

``render()`` is what the files must hold (one per tag of ``event_types()`` and of the request/reply
messages, ``allocation.MESSAGE_TYPES``; sorted keys, two-space
indent, a final newline), so the generator (``tools/gen/gen_schemas.py``, which writes them) and
the golden tests (which compare) read one definition. It must not open files: callers hand
``drift`` the texts they read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec

from seedance.events.allocation import MESSAGE_TYPES
from seedance.events.codec import event_types

__all__ = ["drift", "render"]


def render() -> dict[str, str]:
    """File name (``<tag>.json``) -> the schema's text, for every event type."""
    files: dict[str, str] = {}
    for t in (*event_types(), *MESSAGE_TYPES):
        tag = t.__struct_config__.tag
        files[f"{tag}.json"] = json.dumps(msgspec.json.schema(t), indent=2, sort_keys=True) + "\n"
    return files


def drift(existing: Mapping[str, str]) -> list[str]:
    """The names that differ between ``existing`` (file name -> text) and a fresh render: stale
    or missing ones first, then files no event type has any more; empty when they match."""
    files = render()
    stale = sorted(name for name, text in files.items() if existing.get(name) != text)
    return stale + sorted(set(existing) - set(files))
