"""Open Inference Protocol tensor datatypes and layout conversion.

Owns: the mapping between OIP datatype strings (`FP32`, `INT64`, `BYTES`, ...) and numpy dtypes
and `InferTensorContents` fields, and the per-model layout conversion a backend asks for (a
client sends NHWC, the model's config says NCHW). Pure functions over protobuf messages: no I/O,
no clock.

Must not: guess a layout. A conversion happens only where a model declares it
(`LayoutConversion`); every other tensor is passed through byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2

__all__ = [
    "DATATYPE_TO_CONTENTS_FIELD",
    "DATATYPE_TO_NUMPY",
    "LayoutConversion",
    "LayoutError",
    "convert_request_layouts",
    "convert_response_layouts",
    "permute_shape",
]

# OIP datatype -> numpy dtype, little-endian as the protocol's raw contents are.
DATATYPE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

# OIP datatype -> the repeated field of InferTensorContents that carries it when a client sends
# typed contents. FP16 (and BF16) have no typed field: the protocol says raw only.
DATATYPE_TO_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class LayoutError(ValueError):
    """A tensor cannot be converted as its model's layout declaration says (client's fault)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutConversion:
    """One tensor of one model whose client layout differs from the backend's.

    `client_layout` and `backend_layout` name every axis, batch included, with the same
    letters in a different order (`"NHWC"` -> `"NCHW"`). For an input the gateway transposes
    client -> backend before forwarding; for an output, backend -> client on the way back.
    """

    tensor: str
    client_layout: str
    backend_layout: str

    def __post_init__(self) -> None:
        if sorted(self.client_layout) != sorted(self.backend_layout) or len(
            set(self.client_layout)
        ) != len(self.client_layout):
            raise ValueError(
                f"layout of tensor {self.tensor!r}: client_layout={self.client_layout!r} and "
                f"backend_layout={self.backend_layout!r} must be the same distinct axis letters"
            )

    def to_backend(self) -> tuple[int, ...]:
        """The axis permutation that turns a client-layout array into the backend layout."""
        return tuple(self.client_layout.index(axis) for axis in self.backend_layout)

    def to_client(self) -> tuple[int, ...]:
        """The axis permutation that turns a backend-layout array into the client layout."""
        return tuple(self.backend_layout.index(axis) for axis in self.client_layout)


def permute_shape(shape: Sequence[int], perm: Sequence[int]) -> list[int]:
    """`shape` with its axes reordered by `perm` (as `np.transpose` would)."""
    return [int(shape[i]) for i in perm]


def _transpose_tensor(
    *,
    name: str,
    datatype: str,
    shape: Sequence[int],
    raw: bytes | None,
    contents: service_pb2.InferTensorContents | None,
    perm: tuple[int, ...],
) -> tuple[list[int], bytes | None]:
    """Transpose one tensor; returns the new shape and new raw bytes (or edits `contents`)."""
    if len(shape) != len(perm):
        raise LayoutError(
            f"tensor {name!r}: shape {list(shape)} has rank {len(shape)}, its layout "
            f"declaration has rank {len(perm)}"
        )
    dtype = DATATYPE_TO_NUMPY.get(datatype)
    if dtype is None:
        # BYTES elements are length-prefixed strings of varying size: no fixed stride to move.
        raise LayoutError(f"tensor {name!r}: datatype {datatype!r} has no layout conversion")
    new_shape = permute_shape(shape, perm)
    if raw is not None:
        count = math.prod(shape)  # exact: numpy's int64 product wraps ([2^32, 2^32] -> 0)
        if len(raw) != count * dtype.itemsize:
            raise LayoutError(
                f"tensor {name!r}: {len(raw)} raw bytes, shape {list(shape)} of {datatype} "
                f"needs {count * dtype.itemsize}"
            )
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        return new_shape, np.ascontiguousarray(array.transpose(perm)).tobytes()
    if contents is not None:
        field = DATATYPE_TO_CONTENTS_FIELD[datatype]
        values = getattr(contents, field)
        array = np.asarray(list(values)).reshape(shape).transpose(perm).reshape(-1)
        del values[:]
        values.extend(array.tolist())
    return new_shape, None


def convert_request_layouts(
    request: service_pb2.ModelInferRequest, conversions: Sequence[LayoutConversion]
) -> None:
    """Transpose, in place, the request's inputs that `conversions` name, client -> backend.

    Raw contents (`raw_input_contents[i]` belongs to `inputs[i]`) and typed contents are both
    handled. Raises `LayoutError` (the client's fault) on a rank or size mismatch.
    """
    by_name = {c.tensor: c for c in conversions}
    if not by_name:
        return
    raw_used = len(request.raw_input_contents) > 0
    for index, tensor in enumerate(request.inputs):
        conversion = by_name.get(tensor.name)
        if conversion is None:
            continue
        if raw_used and index >= len(request.raw_input_contents):
            raise LayoutError(f"tensor {tensor.name!r}: no raw_input_contents entry for it")
        new_shape, new_raw = _transpose_tensor(
            name=tensor.name,
            datatype=tensor.datatype,
            shape=list(tensor.shape),
            raw=request.raw_input_contents[index] if raw_used else None,
            contents=None if raw_used else tensor.contents,
            perm=conversion.to_backend(),
        )
        del tensor.shape[:]
        tensor.shape.extend(new_shape)
        if new_raw is not None:
            request.raw_input_contents[index] = new_raw


def convert_response_layouts(
    response: service_pb2.ModelInferResponse, conversions: Sequence[LayoutConversion]
) -> None:
    """Transpose, in place, the response's outputs that `conversions` name, backend -> client."""
    by_name = {c.tensor: c for c in conversions}
    if not by_name:
        return
    raw_used = len(response.raw_output_contents) > 0
    for index, tensor in enumerate(response.outputs):
        conversion = by_name.get(tensor.name)
        if conversion is None:
            continue
        new_shape, new_raw = _transpose_tensor(
            name=tensor.name,
            datatype=tensor.datatype,
            shape=list(tensor.shape),
            raw=response.raw_output_contents[index] if raw_used else None,
            contents=None if raw_used else tensor.contents,
            perm=conversion.to_client(),
        )
        del tensor.shape[:]
        tensor.shape.extend(new_shape)
        if new_raw is not None:
            response.raw_output_contents[index] = new_raw
