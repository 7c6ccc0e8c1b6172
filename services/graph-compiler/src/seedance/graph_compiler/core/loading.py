"""Turning request bytes or a path into a checked ``onnx.ModelProto``, and back.

Owns parsing, validation and the 2 GB protobuf boundary (models past it live as external
data next to a path). Must not optimise anything; failures become ``InvalidModel``.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from seedance.graph_compiler.core.errors import InvalidModel

__all__ = ["PROTOBUF_LIMIT_BYTES", "load_model", "model_bytes", "node_count"]

# protobuf refuses to serialise a message of 2 GiB or more; such models keep their weights as
# external data and every pass must work from the path (research note, pain point 3).
PROTOBUF_LIMIT_BYTES = 2**31 - 1


def load_model(model: bytes | str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Parse and check a model; external data is loaded when given a path."""
    try:
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, bytes | bytearray):
            proto = onnx.load_from_string(bytes(model))
        else:
            path = Path(model)
            if not path.is_file():
                raise InvalidModel(f"model path {str(path)!r} is not a file")
            proto = onnx.load(str(path), load_external_data=True)
    except InvalidModel:
        raise
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-like errors, ...
        raise InvalidModel(f"cannot parse ONNX model: {exc}") from exc
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
