"""Layout conversion and datatype mapping of the OIP gateway (pure)."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from seedance.router.gateway.tensors import (
    DATATYPE_TO_NUMPY,
    LayoutConversion,
    LayoutError,
    convert_request_layouts,
    convert_response_layouts,
    permute_shape,
)

NHWC_TO_NCHW = LayoutConversion(tensor="image", client_layout="NHWC", backend_layout="NCHW")


def _raw_request(array: np.ndarray, datatype: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="other", datatype="INT32", shape=[2])
    request.raw_input_contents.append(np.array([7, 8], dtype="<i4").tobytes())
    request.inputs.add(name="image", datatype=datatype, shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "INT64", "UINT8", "BOOL", "FP64"])
def test_raw_nhwc_input_becomes_nchw(datatype: str) -> None:
    rng = np.random.default_rng(0)
    dtype = DATATYPE_TO_NUMPY[datatype]
    nhwc = (rng.standard_normal((2, 3, 4, 5)) * 10).astype(dtype)
    request = _raw_request(nhwc, datatype)
    convert_request_layouts(request, [NHWC_TO_NCHW])
    assert list(request.inputs[1].shape) == [2, 5, 3, 4]
    got = np.frombuffer(request.raw_input_contents[1], dtype=dtype).reshape(2, 5, 3, 4)
    np.testing.assert_array_equal(got, nhwc.transpose(0, 3, 1, 2))
    # The tensor no declaration names is untouched, byte for byte.
    assert request.raw_input_contents[0] == np.array([7, 8], dtype="<i4").tobytes()
    assert list(request.inputs[0].shape) == [2]


def test_typed_contents_are_converted_too() -> None:
    nhwc = np.arange(2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=list(nhwc.shape))
    tensor.contents.fp32_contents.extend(nhwc.reshape(-1).tolist())
    convert_request_layouts(request, [NHWC_TO_NCHW])
    got = np.array(request.inputs[0].contents.fp32_contents, dtype=np.float32)
    np.testing.assert_array_equal(got, nhwc.transpose(0, 3, 1, 2).reshape(-1))
    assert list(request.inputs[0].shape) == [2, 3, 2, 3]


def test_response_conversion_inverts_request_conversion() -> None:
    nhwc = np.arange(1 * 4 * 5 * 3, dtype=np.float32).reshape(1, 4, 5, 3)
    request = _raw_request(nhwc, "FP32")
    convert_request_layouts(request, [NHWC_TO_NCHW])
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="image", datatype="FP32", shape=list(request.inputs[1].shape))
    response.raw_output_contents.append(request.raw_input_contents[1])
    convert_response_layouts(response, [NHWC_TO_NCHW])
    assert list(response.outputs[0].shape) == [1, 4, 5, 3]
    back = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(1, 4, 5, 3)
    np.testing.assert_array_equal(back, nhwc)


def test_rank_mismatch_is_the_clients_error() -> None:
    request = _raw_request(np.zeros((4, 5, 3), dtype=np.float32), "FP32")
    with pytest.raises(LayoutError, match=r"'image'.*rank 3"):
        convert_request_layouts(request, [NHWC_TO_NCHW])


def test_size_mismatch_is_the_clients_error() -> None:
    request = _raw_request(np.zeros((1, 2, 2, 3), dtype=np.float32), "FP32")
    request.raw_input_contents[1] = b"\x00" * 5
    with pytest.raises(LayoutError, match="5 raw bytes"):
        convert_request_layouts(request, [NHWC_TO_NCHW])


def test_bytes_tensors_have_no_layout_conversion() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="image", datatype="BYTES", shape=[1, 1, 1, 1])
    request.raw_input_contents.append(b"\x01\x00\x00\x00a")
    with pytest.raises(LayoutError, match="BYTES"):
        convert_request_layouts(request, [NHWC_TO_NCHW])


def test_layout_declaration_is_validated() -> None:
    with pytest.raises(ValueError, match="same distinct axis letters"):
        LayoutConversion(tensor="x", client_layout="NHWC", backend_layout="NCH")
    with pytest.raises(ValueError, match="same distinct axis letters"):
        LayoutConversion(tensor="x", client_layout="NHHC", backend_layout="NCHH")


def test_permutations_and_shapes() -> None:
    assert NHWC_TO_NCHW.to_backend() == (0, 3, 1, 2)
    assert NHWC_TO_NCHW.to_client() == (0, 2, 3, 1)
    assert permute_shape([-1, 3, -1, -1], NHWC_TO_NCHW.to_client()) == [-1, -1, -1, 3]
