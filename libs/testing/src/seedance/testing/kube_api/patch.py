"""The three PATCH bodies the API server accepts, as pure functions from (object, patch) to a
new object: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and Kubernetes strategic merge
patch, which merges lists by the key the kind's schema names (``x-kubernetes-patch-merge-key``:
pod conditions by ``type``, containers and env by ``name``, ports by ``containerPort``).

It never mutates its inputs and knows nothing of HTTP or the store; where a schema node comes
from is the caller's (``Strategy``).
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

__all__ = [
    "PatchDecodeError",
    "PatchError",
    "Strategy",
    "json_patch",
    "merge_patch",
    "strategic_merge",
]


class PatchError(ValueError):
    """A patch that cannot apply (a bad pointer, a failed ``test``, a malformed body)."""


class PatchDecodeError(PatchError):
    """A patch body of the wrong shape (the real server: 400, where a failing op is 422)."""


class Strategy(Protocol):
    """The schema of one node of an object, as far as strategic merge needs it."""

    def field(self, name: str) -> Strategy | None: ...
    def item(self) -> Strategy | None: ...
    def merge_key(self) -> str | None: ...
    def merges(self) -> bool: ...


# --- JSON merge patch -----------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- JSON patch -----------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit():
        raise PatchError(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if adding else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index {idx} out of range")
    return idx


def _walk(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for tok in tokens:
        if isinstance(node, dict):
            if tok not in node:
                raise PatchError(f"path not found: /{'/'.join(tokens)}")
            node = node[tok]
        elif isinstance(node, list):
            node = node[_index(node, tok, adding=False)]
        else:
            raise PatchError(f"path not found: /{'/'.join(tokens)}")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise PatchError(f"cannot add at /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path not found: /{'/'.join(tokens)}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, adding=False))
    raise PatchError(f"cannot remove /{'/'.join(tokens)}")


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind = op.get("op")
    tokens = _pointer(str(op.get("path", "")))
    if kind == "add":
        return _add(doc, tokens, copy.deepcopy(op.get("value")))
    if kind == "remove":
        _remove(doc, tokens)
        return doc
    if kind == "replace":
        _walk(doc, tokens)
        if not tokens:
            return copy.deepcopy(op.get("value"))
        _remove(doc, tokens)
        return _add(doc, tokens, copy.deepcopy(op.get("value")))
    if kind in ("move", "copy"):
        source = _pointer(str(op.get("from", "")))
        value = copy.deepcopy(_walk(doc, source))
        if kind == "move":
            _remove(doc, source)
        return _add(doc, tokens, value)
    if kind == "test":
        if _walk(doc, tokens) != op.get("value"):
            raise PatchError(f"test failed at {op.get('path')!r}")
        return doc
    raise PatchError(f"unknown JSON patch op {kind!r}")


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchDecodeError(
            "json: cannot unmarshal object into Go value of type "
            "jsonpatch.Patch (a JSON patch is a list of operations)"
        )
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict):
            raise PatchDecodeError(f"a JSON patch operation is an object, not {op!r}")
        doc = _apply_op(doc, op)
    return doc


# --- strategic merge patch ------------------------------------------------------------------

_DIRECTIVE = "$patch"
_ORDER_PREFIX = "$setElementOrder/"
_DELETE_PRIMITIVE_PREFIX = "$deleteFromPrimitiveList/"
_RETAIN_KEYS = "$retainKeys"


def strategic_merge(target: Any, patch: Any, strategy: Strategy | None) -> Any:
    """Merge ``patch`` into ``target``: maps recursively, lists by their merge key where the
    schema says ``merge``, everything else replaced; ``null`` deletes; ``$patch: replace`` and
    ``$patch: delete`` are honoured, ordering directives ignored."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != _DIRECTIVE}
    if directive == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in (_DIRECTIVE, _RETAIN_KEYS) or key.startswith(_ORDER_PREFIX):
            continue
        if key.startswith(_DELETE_PRIMITIVE_PREFIX):
            name = key[len(_DELETE_PRIMITIVE_PREFIX) :]
            drop = value if isinstance(value, list) else []
            out[name] = [v for v in out.get(name) or [] if v not in drop]
            continue
        _merge_key_into(out, key, value, strategy.field(key) if strategy else None)
    return out


def _merge_key_into(out: dict[str, Any], key: str, value: Any, sub: Strategy | None) -> None:
    if value is None:
        out.pop(key, None)
    elif isinstance(value, list) and sub is not None and sub.merges():
        out[key] = _merge_list(out.get(key) or [], value, sub)
    elif isinstance(value, dict):
        merged = strategic_merge(out.get(key), value, sub)
        if merged is None:
            out.pop(key, None)
        else:
            out[key] = merged
    else:
        out[key] = copy.deepcopy(value)


def _merge_list(current: list[Any], patch: list[Any], strategy: Strategy) -> list[Any]:
    key = strategy.merge_key()
    item = strategy.item()
    if key is None:  # a set of primitives (finalizers): union in order
        out = list(current)
        out.extend(copy.deepcopy(v) for v in patch if v not in out)
        return out
    if len(patch) == 1 and isinstance(patch[0], dict) and patch[0].get(_DIRECTIVE) == "replace":
        return []
    out = [copy.deepcopy(v) for v in current]
    for entry in patch:
        if not isinstance(entry, dict):
            raise PatchError(f"list entries merged by {key!r} must be objects, not {entry!r}")
        pos = next(
            (i for i, v in enumerate(out) if isinstance(v, dict) and v.get(key) == entry.get(key)),
            None,
        )
        if entry.get(_DIRECTIVE) == "delete":
            if pos is not None:
                out.pop(pos)
            continue
        if pos is None:
            out.append(strategic_merge({}, entry, item))
        else:
            out[pos] = strategic_merge(out[pos], entry, item)
    return out
