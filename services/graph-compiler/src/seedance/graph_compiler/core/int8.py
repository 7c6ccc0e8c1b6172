"""INT8 candidates: static QDQ with calibration for convolutional nets, dynamic for MatMul nets.

Owns the choice of method by model type (dynamic INT8 on a CNN turns every Conv into
ConvInteger and ran 4.5× slower than FP32 here; static QDQ halved it — research note,
finding 7) and the calls into ``onnxruntime.quantization``. Must not decide acceptance: the
compiler compares the result with FP32 and asks for node exclusions when it fails.
"""

from __future__ import annotations

import enum
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from seedance.graph_compiler.core.runtime import Feeds

__all__ = ["ModelKind", "classify", "quantizable_nodes", "quantize"]


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
_DYNAMIC_OPS = ("MatMul", "Attention", "Gather", "LSTM", "EmbedLayerNormalization")
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
        if n.op_type in _DYNAMIC_OPS and (n.op_type != "Gather" or n.input[0] in inits)
    ]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: Sequence[Feeds]) -> None:
        self._it = iter(list(feeds))

    def get_next(self) -> Feeds | None:
        return next(self._it, None)


def quantize(
    model: onnx.ModelProto,
    kind: ModelKind,
    calibration: Sequence[Feeds],
    exclude: Sequence[str] = (),
) -> onnx.ModelProto:
    """The INT8 model; ``exclude`` names nodes that stay in float (the fallback set)."""
    with tempfile.TemporaryDirectory(prefix="gc-int8-") as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, src)
        if kind is ModelKind.CONV:
            quantize_static(
                src,
                dst,
                _Reader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=list(exclude),
            )
        else:
            quantize_dynamic(
                src,
                dst,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=list(_DYNAMIC_OPS),
                nodes_to_exclude=list(exclude),
                # Without this, ORT's quantiser fails on tensors shape inference could not
                # type (research note, §9).
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        return onnx.load(str(dst))
