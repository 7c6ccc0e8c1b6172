"""proto/oip/grpc_predict_v2.proto is wire-compatible with the `inference` messages the gateway
serves (tritonclient's): same service, methods, messages, field names, numbers and types."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

DESCRIPTOR_SET = Path(__file__).resolve().parents[3] / "proto/oip/gen/grpc_predict_v2.binpb"


def _messages(
    messages: list[descriptor_pb2.DescriptorProto], prefix: str
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}
    for message in messages:
        name = f"{prefix}.{message.name}"
        found[name] = message
        found.update(_messages(list(message.nested_type), name))
    return found


def _ours() -> descriptor_pb2.FileDescriptorProto:
    file_set = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    (ours,) = file_set.file
    return ours


def _triton() -> descriptor_pb2.FileDescriptorProto:
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    return theirs


def test_same_package_and_service_methods() -> None:
    ours, theirs = _ours(), _triton()
    assert ours.package == theirs.package == "inference"
    (service,) = ours.service
    (triton_service,) = theirs.service
    assert service.name == triton_service.name == "GRPCInferenceService"
    triton_methods = {m.name: m for m in triton_service.method}
    assert {m.name for m in service.method} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
    }
    for method in service.method:
        assert method.input_type == triton_methods[method.name].input_type
        assert method.output_type == triton_methods[method.name].output_type


def test_every_field_matches_on_the_wire() -> None:
    ours = _messages(list(_ours().message_type), ".inference")
    theirs = _messages(list(_triton().message_type), ".inference")
    assert len(ours) >= 20
    for name, message in ours.items():
        assert name in theirs, name
        their_fields = {f.number: f for f in theirs[name].field}
        for field in message.field:
            other = their_fields[field.number]
            assert (field.name, field.type, field.label, field.type_name) == (
                other.name,
                other.type,
                other.label,
                other.type_name,
            ), f"{name}.{field.name}"
