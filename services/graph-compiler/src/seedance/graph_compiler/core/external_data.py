"""Where a model's external data may be read from: files inside the model's own directory.

An ONNX tensor may keep its bytes in a file named by its ``external_data`` ``location``, and
the model comes from a tenant: a location such as ``/etc/passwd`` or ``../../x`` would make the
compiler read, or at least look at, its own files, and an error that told a missing file from a
present one would let a tenant probe the host. Owns the check of every external location,
made on the location string before the filesystem is touched: absolute paths and ``..`` are
refused from the text alone; what remains is walked one component at a time inside the
directory (``lstat``, never following a symlink): a symlink is followed only where its target,
read as text, stays inside. Nothing outside the directory is opened or stat'ed, and every
location that leads out gets the same error, whether or not anything exists there.

``confine`` rewrites each location to the symlink-free path it checked, so the loader opens
exactly that file. Must not read the data itself (onnx does, from the rewritten locations).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

import onnx
from onnx import AttributeProto, TensorProto

from seedance.graph_compiler.core.errors import InvalidModel

__all__ = ["confine", "external_location", "external_tensors", "locate", "outside_error"]

# The kernel's own bound on symlinks in one path (ELOOP): a chain longer than this is a loop.
_MAX_SYMLINKS = 40


def outside_error(tensor: str, location: str) -> str:
    """The one message for every location that leads out of the model's directory."""
    return (
        f"tensor {tensor!r}: external data location {location!r} is outside the model's directory"
    )


def external_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor of ``model`` that keeps its data in a file: initializers, sparse ones,
    attribute tensors, in subgraphs and functions too (at least all that onnx's loader reads)."""
    for tensor in _tensors(model):
        if tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL:
            yield tensor


def external_location(tensor: TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def locate(model_dir: Path | None, tensor: str, location: str) -> Path | None:
    """The file ``location`` names inside ``model_dir`` (which may not exist), or None when
    ``model_dir`` is None and the text alone is inside; ``InvalidModel`` when it leads out."""
    parts = _relative_parts(location)
    if parts is None:
        raise InvalidModel(outside_error(tensor, location))
    if model_dir is None:
        return None
    found = _walk(model_dir.resolve(), parts)
    if found is None:
        raise InvalidModel(outside_error(tensor, location))
    return found


def confine(model: onnx.ModelProto, model_dir: Path) -> None:
    """Check every external location of ``model`` against ``model_dir`` (``InvalidModel`` names
    the first that leads out) and rewrite each to the path inside that was checked."""
    root = model_dir.resolve()
    for tensor in external_tensors(model):
        location = external_location(tensor)
        found = locate(root, tensor.name, location)
        assert found is not None
        inside = found.relative_to(root).as_posix()
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = inside


def _relative_parts(location: str) -> list[str] | None:
    """The location's components if its text stays inside, else None (absolute, ``..``, a NUL,
    a Windows drive or backslash path that would mean something else elsewhere)."""
    if not location or "\0" in location or "\\" in location:
        return None
    path = PurePosixPath(location)
    if path.is_absolute() or (len(location) > 1 and location[1] == ":"):
        return None
    parts = [p for p in path.parts if p != "."]
    if not parts or ".." in parts:
        return None
    return parts


def _walk(root: Path, parts: list[str]) -> Path | None:
    """Resolve ``parts`` under ``root`` without touching anything outside it; None if the path
    leads out. A component that does not exist ends the walk: the rest is judged as text."""
    done: list[str] = []  # components under root, none of them a symlink
    todo = list(parts)
    links = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":  # only from a symlink's target: the original text has none
            if not done:
                return None
            done.pop()
            continue
        here = root.joinpath(*done, part)
        try:
            mode = os.lstat(here).st_mode
        except (FileNotFoundError, NotADirectoryError):
            # Missing inside the directory: nothing further exists, so the rest is text only.
            rest = [p for p in todo if p not in ("", ".")]
            if ".." in rest:
                return None
            return root.joinpath(*done, part, *rest)
        if stat.S_ISLNK(mode):
            links += 1
            target = os.readlink(here)
            if links > _MAX_SYMLINKS or os.path.isabs(target):
                return None
            todo = list(PurePosixPath(target).parts) + todo
            continue
        done.append(part)
    return root.joinpath(*done)


def _tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _attribute_tensors(node.attribute)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _attribute_tensors(node.attribute)


def _attribute_tensors(attributes: Iterable[AttributeProto]) -> Iterator[TensorProto]:
    for a in attributes:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values
            yield a.sparse_tensor.indices
        for sparse in a.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for g in a.graphs:
            yield from _graph_tensors(g)
