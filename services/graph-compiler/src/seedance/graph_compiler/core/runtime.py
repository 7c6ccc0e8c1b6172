"""The core's way to run a model (injected sessions) and seeded sample inputs to run it on.

Owns the ``SessionFactory`` and ``Session`` protocols (the one way the core runs a model in
this process: the FP32 reference, each candidate's accuracy check, the FP16 emulator's
single-node graphs) and the generation of deterministic inputs from a model's declared input
types and shapes. Must not import a runtime or time anything: the shell hands in the sessions
(``seedance.graph_compiler.sessions`` has ONNX Runtime's; tests may hand in others), and the
seed comes from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx
from onnx import helper

from seedance.graph_compiler.core.errors import InvalidModel

__all__ = [
    "MAX_SAMPLE_BYTES",
    "OPT_LEVELS",
    "Feeds",
    "Session",
    "SessionFactory",
    "sample_inputs",
    "static_input_shapes",
]

Feeds = dict[str, np.ndarray]

#: The graph optimisation levels a session may be asked for (ONNX Runtime's four).
OPT_LEVELS = ("disable", "basic", "extended", "all")

#: The most bytes one calibration sample (every declared input, in its own type) may take: the
#: samples (8 by default) are held for the whole compile, 2 GiB at this bound. A 4K frame
#: (3x2160x3840 float32) is 95 MiB, a batch of 8 1024x1024 RGB images 96 MiB, BERT's [1, 128]
#: ids 1 KiB. A 108-byte model declaring [1, 2^25] floats cost the compile child 1,413 MiB when
#: samples were drawn in float64; [2^40, 2^40] raised numpy's ValueError (an internal error)
#: instead of a named one.
MAX_SAMPLE_BYTES = 256 << 20


class Session(Protocol):
    """One loaded model on the CPU, run with numpy feeds."""

    @property
    def input_names(self) -> Sequence[str]:
        """The names the session takes as inputs, in its order."""
        ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Every graph output, in the graph's order, as numpy arrays."""
        ...


class SessionFactory(Protocol):
    def session(
        self, model: onnx.ModelProto | bytes, level: str = "disable", threads: int = 1
    ) -> Session:
        """``model`` loaded under optimisation ``level`` (one of ``OPT_LEVELS``) with
        ``threads`` intra-op threads; raises ``InvalidModel`` with the runtime's message when
        it cannot load the model."""
        ...


def static_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Declared input shapes; raises ``InvalidModel`` naming any input with a symbolic dim."""
    inits = {i.name for i in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or any(
            not d.HasField("dim_value") for d in dims
        ):
            raise InvalidModel(f"input {vi.name!r} has no static shape; pin it in the policy")
        shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    return shapes


def _gather_rows(model: onnx.ModelProto) -> dict[str, int]:
    """Inputs used as Gather indices into an initializer table: the table's row count bounds
    the ids (a token id past the vocabulary would make ORT fail, not the compiler)."""
    sizes = {i.name: list(i.dims) for i in model.graph.initializer}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in sizes:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = sizes[node.input[0]]
            if dims:
                bounds[node.input[1]] = min(bounds.get(node.input[1], 1 << 62), dims[axis])
    return bounds


def _sample_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """What drawing one sample of an input costs at its peak: its own type's bytes, and a
    float16 input is drawn in float32 first (Python ints: [2^40, 2^40] does not overflow)."""
    item = max(dtype.itemsize, 4) if np.issubdtype(dtype, np.floating) else dtype.itemsize
    return math.prod(shape) * item


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _refuse_large(
    shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, np.dtype], max_bytes: int
) -> None:
    sizes = {name: _sample_bytes(shape, dtypes[name]) for name, shape in shapes.items()}
    total = sum(sizes.values())
    if total <= max_bytes:
        return
    largest = sorted(sizes, key=lambda n: -sizes[n])[:3]
    named = ", ".join(
        f"input {n!r} declares shape {list(shapes[n])} of {dtypes[n].name} ({sizes[n]:,} bytes, "
        f"{_mib(sizes[n])})"
        for n in largest
    )
    more = f" and {len(sizes) - 3} more input(s)" if len(sizes) > 3 else ""
    raise InvalidModel(
        f"{named}{more}: one calibration sample would take {total:,} bytes, over the "
        f"{max_bytes:,} bytes ({_mib(max_bytes)}) per sample the compiler draws"
    )


def sample_inputs(
    model: onnx.ModelProto, count: int, seed: int, max_bytes: int = MAX_SAMPLE_BYTES
) -> list[Feeds]:
    """``count`` seeded input sets. Float inputs are standard normal (drawn in float32, or
    float64 for a float64 input); integer inputs feeding an embedding table are ids below its
    row count; masks are ones with a varying padded tail (as real batches have); other integers
    are 0/1. Inputs whose one sample would take more than ``max_bytes`` together are refused
    with ``InvalidModel`` naming the largest, their shapes and bytes, before any is drawn."""
    rng = np.random.default_rng(seed)
    shapes = static_input_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    dtypes = {name: np.dtype(helper.tensor_dtype_to_np_dtype(types[name])) for name in shapes}
    _refuse_large(shapes, dtypes, max_bytes)
    bounds = _gather_rows(model)
    out: list[Feeds] = []
    for k in range(count):
        feeds: Feeds = {}
        for name, shape in shapes.items():
            dtype = dtypes[name]
            if np.issubdtype(dtype, np.floating):
                drawn = np.float64 if dtype == np.float64 else np.float32
                feeds[name] = rng.standard_normal(shape, dtype=drawn).astype(dtype, copy=False)
            elif dtype == np.bool_:
                feeds[name] = rng.integers(0, 2, shape, dtype=np.uint8).astype(np.bool_)
            elif "mask" in name.lower():
                arr = np.ones(shape, dtype)
                if shape:
                    valid = max(1, shape[-1] - (k * shape[-1]) // (2 * max(count, 1)))
                    arr[..., valid:] = 0
                feeds[name] = arr
            elif np.issubdtype(dtype, np.integer):
                high = min(bounds.get(name, 2), int(np.iinfo(dtype).max) + 1)
                feeds[name] = rng.integers(0, high, shape, dtype=dtype)  # no int64 copy first
            else:
                feeds[name] = rng.integers(0, 2, shape).astype(dtype)
        out.append(feeds)
    return out
