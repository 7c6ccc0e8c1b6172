"""KServe v2 (Open Inference Protocol) REST JSON <-> the OIP gRPC messages the gateway forwards.

Owns: the translation of the REST protocol's JSON bodies (inference request and response, model
metadata) to and from `inference.*` protobuf messages, so REST requests travel to the replicas
over the same gRPC path as gRPC ones. Pure functions: no I/O, no clock.

Must not: accept what the spec does not say, or fail on what a client sends. Input tensors
travel as raw little-endian bytes (one form for every datatype, FP16 included, which has no
typed field); BYTES elements are JSON strings, sent UTF-8 encoded with the protocol's 4-byte
length prefix. The binary-data extension (``binary_data_size``) is refused with a clear error
rather than misread. Every other malformed body is a `RestRequestError` naming the field (the
REST front answers 400 with it): a shape is at most ``MAX_RANK`` int64 dimensions whose exact
product is the element count (``[2^32, 2^32]`` overflowed numpy's int64 product to 0 and let
empty data through), data nests no deeper than its shape, elements are of the datatype's JSON
kind and within its range, integer parameters fit int64.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from seedance.router.gateway.tensors import DATATYPE_TO_CONTENTS_FIELD, DATATYPE_TO_NUMPY

__all__ = [
    "MAX_RANK",
    "RestRequestError",
    "infer_request_from_json",
    "infer_response_to_json",
    "metadata_to_json",
]


#: The most dimensions a tensor may have (ONNX and TensorRT allow far fewer); also how deep
#: its data may nest, so the walk over it is bounded.
MAX_RANK = 64
_INT64 = (-(2**63), 2**63 - 1)
_END = object()


class RestRequestError(ValueError):
    """A REST body that is not a valid v2 inference request (answered 400, naming the field)."""


def _brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error names the value, never echoes a
    megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _flatten(name: str, data: Any, rank: int) -> list[Any]:
    """The elements of ``data`` in row-major order: a scalar, a flat list, or lists nested at
    most ``rank`` deep (one level for a scalar's shape ``[]``). Iterative: a 50,000-deep
    nesting once overflowed the recursion here."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            if len(stack) >= max(rank, 1):
                raise RestRequestError(
                    f"input {name!r}: data nests deeper than its shape's {rank} dimensions"
                )
            stack.append(iter(item))
        else:
            out.append(item)
    return out


def _bytes_raw(name: str, values: Sequence[Any]) -> bytes:
    out = bytearray()
    for value in values:
        if not isinstance(value, str):
            raise RestRequestError(f"input {name!r}: BYTES data must be strings, got {value!r}")
        encoded = value.encode("utf-8")
        out += struct.pack("<I", len(encoded)) + encoded
    return bytes(out)


def _json_kind_ok(datatype: str, value: Any) -> bool:
    """Whether a JSON element is of the datatype's kind: BOOL takes true/false, the integer
    types integers (never a bool, never 1.5 truncated to 1), the float types numbers."""
    if datatype == "BOOL":
        return isinstance(value, bool)
    if datatype.startswith(("INT", "UINT")):
        return type(value) is int
    return type(value) in (int, float)


def _input_raw(name: str, datatype: str, shape: Sequence[int], data: Any) -> bytes:
    values = _flatten(name, data, len(shape))
    count = math.prod(shape)  # exact: numpy's int64 product wraps ([2^32, 2^32] -> 0)
    if len(values) != count:
        raise RestRequestError(
            f"input {name!r}: {len(values)} data elements, shape {_brief(list(shape))} "
            f"needs {count}"
        )
    if datatype == "BYTES":
        return _bytes_raw(name, values)
    dtype = DATATYPE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise RestRequestError(f"input {name!r}: unknown datatype {_brief(datatype)}")
    wrong = next((v for v in values if not _json_kind_ok(datatype, v)), _END)
    if wrong is not _END:
        raise RestRequestError(f"input {name!r}: data is not {datatype}: {_brief(wrong)}")
    try:
        # over="raise": 1e300 as FP16 is an error, not a silent infinity
        with np.errstate(over="raise"):
            return np.asarray(values, dtype=dtype).tobytes()
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        raise RestRequestError(f"input {name!r}: data is not {datatype}: {exc}") from None


def _set_parameters(target: Any, parameters: Any, where: str) -> None:
    if parameters is None:
        return
    if not isinstance(parameters, Mapping):
        raise RestRequestError(f"{where}: parameters must be an object")
    for key, value in parameters.items():
        if key == "binary_data_size" or key == "binary_data":
            raise RestRequestError(f"{where}: the binary-data extension is not supported")
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if not _INT64[0] <= value <= _INT64[1]:
                raise RestRequestError(
                    f"{where}: parameter {key!r} = {_brief(value)} does not fit int64"
                )
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise RestRequestError(
                f"{where}: parameter {key!r} must be a scalar, got {_brief(value)}"
            )


def _add_input(request: service_pb2.ModelInferRequest, index: int, tensor: Any) -> None:
    if not isinstance(tensor, Mapping):
        raise RestRequestError(f"inputs[{index}] must be an object")
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise RestRequestError(f"inputs[{index}]: name and datatype must be strings")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(d) is int and 0 <= d <= _INT64[1] for d in shape)
    ):
        raise RestRequestError(
            f"input {name!r}: shape {_brief(shape)} must be a list of at most {MAX_RANK} "
            "integers in 0..2^63-1"
        )
    if "data" not in tensor:
        raise RestRequestError(f"input {name!r}: no data")
    entry = request.inputs.add(name=name, datatype=datatype)
    entry.shape.extend(shape)
    _set_parameters(entry.parameters, tensor.get("parameters"), f"input {name!r}")
    request.raw_input_contents.append(_input_raw(name, datatype, shape, tensor["data"]))


def infer_request_from_json(model: str, body: Any) -> service_pb2.ModelInferRequest:
    """A v2 inference request body (``POST /v2/models/{model}/infer``) as a ModelInferRequest."""
    if not isinstance(body, Mapping):
        raise RestRequestError("the request body must be a JSON object")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RestRequestError("inputs must be a non-empty list")
    request_id = body.get("id") or ""  # null: absent, as the spec's optional fields
    if not isinstance(request_id, str):
        raise RestRequestError(f"id must be a string, got {_brief(request_id)}")
    outputs = body.get("outputs") or []
    if not isinstance(outputs, list):
        raise RestRequestError(f"outputs must be a list, got {_brief(outputs)}")
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    _set_parameters(request.parameters, body.get("parameters"), "request")
    for index, tensor in enumerate(inputs):
        _add_input(request, index, tensor)
    for index, wanted in enumerate(outputs):
        if not isinstance(wanted, Mapping) or not isinstance(wanted.get("name"), str):
            raise RestRequestError(f"outputs[{index}] must be an object with a name")
        out = request.outputs.add(name=wanted["name"])
        _set_parameters(out.parameters, wanted.get("parameters"), f"output {wanted['name']!r}")
    return request


def _decode_bytes(raw: bytes) -> list[str]:
    values, offset = [], 0
    while offset + 4 <= len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        # Non-UTF-8 bytes cannot be a JSON string: replaced (the gRPC front carries them intact).
        values.append(raw[offset : offset + length].decode("utf-8", "replace"))
        offset += length
    return values


def _output_data(
    tensor: service_pb2.ModelInferResponse.InferOutputTensor, raw: bytes | None
) -> list[Any]:
    if raw is None:
        field = DATATYPE_TO_CONTENTS_FIELD.get(tensor.datatype)
        values = list(getattr(tensor.contents, field)) if field else []
        if tensor.datatype == "BYTES":
            return [v.decode("utf-8", "replace") for v in values]
        return values
    if tensor.datatype == "BYTES":
        return _decode_bytes(raw)
    dtype = DATATYPE_TO_NUMPY.get(tensor.datatype)
    if dtype is None:
        raise ValueError(f"output {tensor.name!r}: datatype {tensor.datatype!r} has no JSON form")
    return list(np.frombuffer(raw, dtype=dtype).tolist())


def _parameters_json(parameters: Any) -> dict[str, Any]:
    return {key: getattr(p, p.WhichOneof("parameter_choice")) for key, p in parameters.items()}


def infer_response_to_json(response: service_pb2.ModelInferResponse) -> dict[str, Any]:
    """A ModelInferResponse as the v2 REST response body (each output's data flat, row-major)."""
    raws = list(response.raw_output_contents)
    outputs = []
    for index, tensor in enumerate(response.outputs):
        out: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": [int(d) for d in tensor.shape],
            "data": _output_data(tensor, raws[index] if index < len(raws) else None),
        }
        if tensor.parameters:
            out["parameters"] = _parameters_json(tensor.parameters)
        outputs.append(out)
    body: dict[str, Any] = {"model_name": response.model_name, "outputs": outputs}
    if response.model_version:
        body["model_version"] = response.model_version
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = _parameters_json(response.parameters)
    return body


def metadata_to_json(metadata: service_pb2.ModelMetadataResponse) -> dict[str, Any]:
    """A ModelMetadataResponse as the v2 REST model metadata body."""

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]}
            for t in items
        ]

    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": tensors(metadata.inputs),
        "outputs": tensors(metadata.outputs),
    }
