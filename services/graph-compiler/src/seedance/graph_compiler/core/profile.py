"""Session profiles: how an artifact is run where it is timed and where it is served.

Owns the typed description of a session configuration (execution provider, optimisation level,
IO binding, CUDA-graph capture, NHWC preference), the description of the machine a measurer
times on (``TargetInfo``), the profiles worth trying per provider, their round trip through an
artifact's ONNX metadata, and their translation into a Triton model configuration (the
onnxruntime backend's parameters). Pure data and text: must not create sessions, read the
machine or time anything (the injected measurer and ``seedance.graph_compiler.measuring`` do).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import onnx

__all__ = [
    "CPU_EP",
    "CUDA_EP",
    "PROFILE_METADATA_KEY",
    "SessionProfile",
    "TargetInfo",
    "candidate_profiles",
    "profile_from_model",
    "triton_config",
    "with_profile",
]

CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
PROFILE_METADATA_KEY = "seedance.deployment_profile"


@dataclass(frozen=True, kw_only=True)
class SessionProfile:
    """One session configuration. ``notes`` say why a setting is off (e.g. CUDA-graph capture
    refused by ORT), so a reader of the report or the artifact knows it was tried."""

    provider: str = CPU_EP
    opt_level: str = "all"  # "disable" | "basic" | "extended" | "all"
    intra_op_threads: int = 0  # 0: ORT's default (one per core)
    io_binding: bool = False  # inputs and outputs bound to device buffers, not numpy per run
    cuda_graph: bool = False  # the whole graph captured once and replayed (CUDA EP only)
    prefer_nhwc: bool = False  # CUDA EP's NHWC kernels (tensor-core convolutions in FP16)
    io_dtype: str = "float32"  # the artifact's graph I/O type; FP16 casts sit inside the graph
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        parts = ["cuda" if self.provider == CUDA_EP else "cpu"]
        parts += [
            n
            for n, on in (
                ("iob", self.io_binding),
                ("graph", self.cuda_graph),
                ("nhwc", self.prefer_nhwc),
            )
            if on
        ]
        return "+".join(parts)

    def to_json(self) -> str:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SessionProfile:
        d = json.loads(text)
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}  # newer writers may add fields
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class TargetInfo:
    """Where a measurer times and runs candidates: the provider, and the machine in words
    (CPU model and ISA, or the GPU) so every report says what its figures were measured on."""

    provider: str
    machine: str
    isa: tuple[str, ...] = ()  # CPU: avx2, avx512f, avx512_vnni, amx_int8 ... as present
    gpu: str | None = None
    # ORT's CUDA EP has no fast INT8 kernels (QDQ runs dequantised, dynamic INT8 on the CPU
    # side); only TensorRT's would. INT8 is a candidate on a GPU only where this is True.
    int8_accelerated: bool = True
    extra: Mapping[str, str] = field(default_factory=dict)


def candidate_profiles(target: TargetInfo, conv_model: bool) -> list[SessionProfile]:
    """The session configurations timed for every candidate on ``target``, plainest first.
    On CUDA: IO binding, then CUDA graphs on top (batch-1 inference is launch-bound there),
    and for convolutional nets NHWC kernels; on the CPU one configuration (ORT_ENABLE_ALL)."""
    if target.provider != CUDA_EP:
        return [SessionProfile(provider=target.provider)]
    plain = SessionProfile(provider=CUDA_EP)
    out = [plain, replace(plain, io_binding=True), replace(plain, io_binding=True, cuda_graph=True)]
    if conv_model:
        out.append(replace(plain, io_binding=True, cuda_graph=True, prefer_nhwc=True))
    return out


def with_profile(model: onnx.ModelProto, profile: SessionProfile) -> onnx.ModelProto:
    """A copy of ``model`` carrying ``profile`` in its metadata (``load_session`` reads it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [p for p in out.metadata_props if p.key != PROFILE_METADATA_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(keep)
    entry = out.metadata_props.add()
    entry.key, entry.value = PROFILE_METADATA_KEY, profile.to_json()
    return out


def profile_from_model(model: onnx.ModelProto) -> SessionProfile | None:
    for p in model.metadata_props:
        if p.key == PROFILE_METADATA_KEY:
            return SessionProfile.from_json(p.value)
    return None


_TRITON_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}
# Triton's onnxruntime backend: optimization.graph.level -1 = basic, 1 = extended, 2 = disabled;
# absent = ORT_ENABLE_ALL.
_TRITON_LEVELS = {"basic": -1, "extended": 1, "disable": 2}


def _tensor_entries(values: Sequence[onnx.ValueInfoProto], skip: set[str]) -> list[str]:
    out = []
    for vi in values:
        if vi.name in skip:
            continue
        tt = vi.type.tensor_type
        dims = ", ".join(
            str(d.dim_value) if d.HasField("dim_value") else "-1" for d in tt.shape.dim
        )
        dtype = _TRITON_TYPES.get(tt.elem_type, "TYPE_FP32")
        out.append(f'  {{ name: "{vi.name}" data_type: {dtype} dims: [ {dims} ] }}')
    return out


def triton_config(model_name: str, model: onnx.ModelProto, profile: SessionProfile) -> str:
    """The profile as a Triton ``config.pbtxt`` for the onnxruntime backend. IO binding has no
    key there: Triton binds inputs and outputs itself (to GPU buffers with CUDA shared memory),
    so it is stated in a comment."""
    inits = {i.name for i in model.graph.initializer}
    gpu = profile.provider == CUDA_EP
    lines = [
        f"# written by the seedance graph-compiler from profile {profile.label}",
        f'name: "{model_name}"',
        'backend: "onnxruntime"',
        "max_batch_size: 0",
        "input [",
        ",\n".join(_tensor_entries(model.graph.input, inits)),
        "]",
        "output [",
        ",\n".join(_tensor_entries(model.graph.output, set())),
        "]",
        f"instance_group [ {{ count: 1 kind: {'KIND_GPU' if gpu else 'KIND_CPU'} }} ]",
    ]
    opt: list[str] = []
    if profile.opt_level in _TRITON_LEVELS:
        opt.append(f"  graph: {{ level: {_TRITON_LEVELS[profile.opt_level]} }}")
    if gpu:
        params = [("enable_cuda_graph", "1" if profile.cuda_graph else "0")]
        if profile.prefer_nhwc:
            params.append(("prefer_nhwc", "1"))
        body = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in params)
        accel = f'[ {{ name: "cuda" {body} }} ]'
        opt.append(f"  execution_accelerators {{ gpu_execution_accelerator: {accel} }}")
    if opt:
        lines += ["optimization {", *opt, "}"]
    if profile.intra_op_threads:
        lines.append(
            'parameters { key: "intra_op_thread_count" value: { string_value: '
            f'"{profile.intra_op_threads}" }} }}'
        )
    if profile.io_binding:
        lines.append("# io_binding: Triton binds I/O itself; send inputs in CUDA shared memory")
    lines += [f"# note: {n}" for n in profile.notes]
    return "\n".join(lines) + "\n"
