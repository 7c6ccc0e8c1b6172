"""Turning request bytes or a path into a checked ``onnx.ModelProto``, and back.

Owns parsing, validation and the 2 GB protobuf boundary (models past it live as external
data next to a path). External data is read only from the model's own directory, after
``external_data.confine`` checked every location; a model given as bytes or a proto has no
directory, so its external data is refused without looking anywhere. Must not optimise
anything; failures become ``InvalidModel``.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import external_data_helper

from seedance.graph_compiler.core.errors import InvalidModel
from seedance.graph_compiler.core.external_data import (
    confine,
    external_location,
    external_tensors,
)

__all__ = [
    "PROTOBUF_LIMIT_BYTES",
    "all_node_count",
    "load_model",
    "model_bytes",
    "node_count",
]

# protobuf refuses to serialise a message of 2 GiB or more; such models keep their weights as
# external data and every pass must work from the path (research note, pain point 3).
PROTOBUF_LIMIT_BYTES = 2**31 - 1


def _parse(model: bytes | str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """The proto, with its external data loaded from its own directory when given a path."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray):
        return onnx.load_from_string(bytes(model))
    path = Path(model)
    if not path.is_file():
        raise InvalidModel(f"model path {str(path)!r} is not a file")
    # Parsed without its data first: the locations are checked before any is opened.
    proto = onnx.load(str(path), load_external_data=False)
    confine(proto, path.parent)
    external_data_helper.load_external_data_for_model(proto, str(path.parent))
    return proto


def load_model(model: bytes | str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Parse and check a model; external data is loaded when given a path."""
    try:
        proto = _parse(model)
    except InvalidModel:
        raise
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-like errors, ...
        raise InvalidModel(f"cannot parse ONNX model: {exc}") from exc
    if (t := next(external_tensors(proto), None)) is not None:
        # Left unloaded, ONNX Runtime and the checker would look in the working directory.
        raise InvalidModel(
            f"tensor {t.name!r} keeps its data in {external_location(t)!r}, but a model given "
            "as bytes or a proto has no directory to read it from: give its path"
        )
    if not proto.graph.node:
        raise InvalidModel("model graph has no nodes")
    if not proto.graph.output:
        raise InvalidModel("model graph has no outputs")
    try:
        if proto.ByteSize() < PROTOBUF_LIMIT_BYTES:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise InvalidModel(f"onnx checker rejected the model: {exc}") from exc
    return proto


def model_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def node_count(model: onnx.ModelProto) -> int:
    return len(model.graph.node)


def all_node_count(model: onnx.ModelProto) -> int:
    """Every node, those of subgraphs (``Loop``/``If``/``Scan`` bodies) included: what the
    passes and the FP16 emulator walk. Iterative, so deep nesting costs no recursion."""
    count, graphs = 0, [model.graph]
    while graphs:
        graph = graphs.pop()
        count += len(graph.node)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(attr.graphs)
    return count
