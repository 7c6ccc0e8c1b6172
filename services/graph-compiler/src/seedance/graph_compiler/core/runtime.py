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
    "MAX_INPUT_ELEMENTS",
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

#: The most elements a declared input may have: each calibration sample of it is drawn in
#: float64 (then cast), so 2^24 is 128 MiB drawn and 64 MiB kept per float32 sample, 512 MiB
#: for the default 8. A 1x3x1024x1024 image is 3.1 M; BERT's [1, 128] ids are 128. A 108-byte
#: model declaring [1, 2^25] cost the compile child 1,413 MiB; [2^40, 2^40] raised numpy's
#: ValueError (an internal error) instead of a named one.
MAX_INPUT_ELEMENTS = 1 << 24


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


def sample_inputs(
    model: onnx.ModelProto, count: int, seed: int, max_elements: int = MAX_INPUT_ELEMENTS
) -> list[Feeds]:
    """``count`` seeded input sets. Float inputs are standard normal; integer inputs feeding
    an embedding table are ids below its row count; masks are ones with a varying padded tail
    (as real batches have); other integers are 0/1. An input declaring more than
    ``max_elements`` elements is refused with ``InvalidModel`` naming it and its shape."""
    rng = np.random.default_rng(seed)
    shapes = static_input_shapes(model)
    for name, shape in shapes.items():
        elements = math.prod(shape)  # Python ints: [2^40, 2^40] does not overflow
        if elements > max_elements:
            raise InvalidModel(
                f"input {name!r} declares shape {list(shape)} ({elements:,} elements): over "
                f"the {max_elements:,} elements per input the compiler draws calibration "
                "samples of"
            )
    bounds = _gather_rows(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    out: list[Feeds] = []
    for k in range(count):
        feeds: Feeds = {}
        for name, shape in shapes.items():
            dtype = helper.tensor_dtype_to_np_dtype(types[name])
            if np.issubdtype(dtype, np.floating):
                feeds[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                feeds[name] = rng.integers(0, 2, shape).astype(np.bool_)
            elif "mask" in name.lower():
                arr = np.ones(shape, dtype)
                if shape:
                    valid = max(1, shape[-1] - (k * shape[-1]) // (2 * max(count, 1)))
                    arr[..., valid:] = 0
                feeds[name] = arr
            else:
                high = bounds.get(name, 2)
                feeds[name] = rng.integers(0, high, shape).astype(dtype)
        out.append(feeds)
    return out
