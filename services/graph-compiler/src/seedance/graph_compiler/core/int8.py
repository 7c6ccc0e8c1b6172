"""INT8 candidates: static QDQ with calibration for convolutional nets, dynamic for MatMul nets.

Owns the choice of method by model type (dynamic INT8 on a CNN turns every Conv into
ConvInteger and ran 4.5× slower than FP32 here; static QDQ halved it — research note,
finding 7), the nodes each method quantises, and the ``Quantizer`` protocol the shell
implements (``onnxruntime.quantization`` is not imported here: the core does no I/O). Must not
decide acceptance: the compiler compares the result with FP32 and asks for node exclusions
when it fails.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Protocol

import onnx

from seedance.graph_compiler.core.runtime import Feeds

__all__ = ["DYNAMIC_OPS", "ModelKind", "Quantizer", "classify", "quantizable_nodes"]


class ModelKind(enum.StrEnum):
    CONV = "conv"  # static QDQ with calibration
    MATMUL = "matmul"  # dynamic: weights INT8, activations quantised per run


_CONV_OPS = frozenset({"Conv", "ConvTranspose"})
_MATMUL_OPS = frozenset({"MatMul", "Gemm"})


def classify(model: onnx.ModelProto) -> ModelKind:
    """By weight volume: the op family holding most of the initializer elements dominates the
    compute on a batch-1 graph (a CNN's one classifier Gemm does not make it a MatMul net)."""
    sizes = {i.name: _numel(i.dims) for i in model.graph.initializer}
    conv = sum(
        sizes.get(n.input[1], 0)
        for n in model.graph.node
        if n.op_type in _CONV_OPS and len(n.input) > 1
    )
    matmul = sum(
        max(sizes.get(i, 0) for i in n.input) for n in model.graph.node if n.op_type in _MATMUL_OPS
    )
    return ModelKind.CONV if conv > matmul else ModelKind.MATMUL


def _numel(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


# Dynamic INT8 quantises these; Conv is left out on purpose: ConvInteger has no fast kernel
# (a MatMul net with a conv stem, like a ViT's patch embedding, keeps that conv in float).
DYNAMIC_OPS = ("MatMul", "Attention", "Gather", "LSTM", "EmbedLayerNormalization")
_STATIC_OPS = _CONV_OPS | _MATMUL_OPS | {"Add", "Mul", "Relu", "MaxPool", "GlobalAveragePool"}


def quantizable_nodes(model: onnx.ModelProto, kind: ModelKind) -> list[str]:
    """Nodes the chosen method would quantise, in graph order (the fallback candidates).
    Gather counts only when it reads a weight table (an embedding), not an activation."""
    inits = {i.name for i in model.graph.initializer}
    if kind is ModelKind.CONV:
        return [n.name for n in model.graph.node if n.op_type in _STATIC_OPS]
    return [
        n.name
        for n in model.graph.node
        if n.op_type in DYNAMIC_OPS and (n.op_type != "Gather" or n.input[0] in inits)
    ]


class Quantizer(Protocol):
    """The INT8 quantiser the shell hands in (``seedance.graph_compiler.quantizing`` has ONNX
    Runtime's): static QDQ with ``calibration`` for ``ModelKind.CONV``, dynamic over
    ``DYNAMIC_OPS`` for ``ModelKind.MATMUL``; the nodes named in ``exclude`` stay in float
    (the fallback set). It may raise anything on a graph it cannot type; the compiler turns
    that into the candidate's refusal."""

    def quantize(
        self,
        model: onnx.ModelProto,
        kind: ModelKind,
        calibration: Sequence[Feeds],
        exclude: Sequence[str] = (),
    ) -> onnx.ModelProto: ...
