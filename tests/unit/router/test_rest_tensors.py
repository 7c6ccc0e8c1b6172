"""KServe v2 REST JSON <-> OIP protobuf: every datatype, BYTES framing, refusals that name."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from seedance.router.gateway import (
    RestRequestError,
    http_status,
    infer_request_from_json,
    infer_response_to_json,
)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [[1.5, -2.0]]),
        ("FP16", [[0.5, 4.0]]),
        ("FP64", [[1e300, -1.0]]),
        ("INT8", [[-128, 127]]),
        ("UINT64", [[0, 2**64 - 1]]),
        ("INT64", [[-(2**63), 2**63 - 1]]),
        ("BOOL", [[True, False]]),
    ],
)
def test_numeric_inputs_become_raw_little_endian_and_come_back(
    datatype: str, data: list[list[object]]
) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": datatype, "data": data}]}
    request = infer_request_from_json("m", body)
    assert request.model_name == "m"
    assert list(request.inputs[0].shape) == [1, 2]
    # What a backend echoing the tensor answers, through the response translation.
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="y", datatype=datatype, shape=[1, 2])
    response.raw_output_contents.append(request.raw_input_contents[0])
    (out,) = infer_response_to_json(response)["outputs"]
    assert out == {"name": "y", "datatype": datatype, "shape": [1, 2], "data": data[0]}


def test_bytes_are_length_prefixed_utf8() -> None:
    body = {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["hé", ""]}]}
    raw = infer_request_from_json("m", body).raw_input_contents[0]
    assert raw == b"\x03\x00\x00\x00h\xc3\xa9\x00\x00\x00\x00"
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="s", datatype="BYTES", shape=[2])
    response.raw_output_contents.append(raw)
    assert infer_response_to_json(response)["outputs"][0]["data"] == ["hé", ""]


def test_parameters_ids_and_requested_outputs_are_carried() -> None:
    body = {
        "id": "r1",
        "parameters": {"sequence_id": 7, "flag": True, "temperature": 0.5, "tag": "x"},
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [3]}],
        "outputs": [{"name": "y"}],
    }
    request = infer_request_from_json("m", body)
    assert request.id == "r1"
    assert request.parameters["sequence_id"].int64_param == 7
    assert request.parameters["flag"].bool_param is True
    assert request.parameters["temperature"].double_param == 0.5
    assert request.parameters["tag"].string_param == "x"
    assert [o.name for o in request.outputs] == ["y"]
    assert np.frombuffer(request.raw_input_contents[0], "<i4").tolist() == [3]


def test_typed_contents_in_a_response_are_read_too() -> None:
    response = service_pb2.ModelInferResponse(model_name="m", id="r")
    out = response.outputs.add(name="y", datatype="INT32", shape=[2])
    out.contents.int_contents.extend([4, 5])
    assert infer_response_to_json(response)["outputs"][0]["data"] == [4, 5]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ([], "JSON object"),
        ({"inputs": []}, "inputs"),
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}, "'x'"),
        ({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}, "shape"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]}, "FP8"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": ["a"]}]}, "INT8"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}]}, "strings"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "no data"),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1],
                        "datatype": "FP32",
                        "data": [1],
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            },
            "binary-data",
        ),
    ],
)
def test_a_bad_body_is_refused_naming_what_is_wrong(body: object, named: str) -> None:
    with pytest.raises(RestRequestError, match=named):
        infer_request_from_json("m", body)


def test_http_status_of_grpc_outcomes() -> None:
    import grpc

    assert http_status(grpc.StatusCode.INVALID_ARGUMENT) == 400
    assert http_status(grpc.StatusCode.NOT_FOUND) == 404
    assert http_status(grpc.StatusCode.UNAVAILABLE) == 503
    assert http_status(grpc.StatusCode.DEADLINE_EXCEEDED) == 504
    assert http_status(grpc.StatusCode.INTERNAL) == 500
