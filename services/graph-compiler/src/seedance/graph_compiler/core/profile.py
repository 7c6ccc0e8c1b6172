"""Session profiles: how an artifact is run where it is timed and where it is served.

Owns the typed description of a session configuration (execution provider, optimisation level,
IO binding, CUDA-graph capture, NHWC preference, further CUDA EP options), the description of
the machine a measurer times on (``TargetInfo``), the profiles worth trying per provider, their
round trip through an artifact's ONNX metadata, and their translation into a Triton model
configuration (the onnxruntime backend's parameters). Pure data and text: must not create
sessions, read the machine or time anything (the injected measurer and
``seedance.graph_compiler.measuring`` do).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import onnx

__all__ = [
    "ALGO_HEURISTIC",
    "CPU_EP",
    "CUDA_EP",
    "FUSE_CONV_BIAS",
    "PROFILE_METADATA_KEY",
    "SDPA_KERNELS",
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
# CUDA EP options a profile sets through its own fields (or that name the device): never in
# ``provider_options``, so one setting has one place.
_RESERVED_OPTIONS = frozenset({"device_id", "enable_cuda_graph", "prefer_nhwc"})
# cuDNN frontend convolutions (cuDNN 9 builds of ORT's CUDA EP): ``fuse_conv_bias`` puts a Conv's
# bias add into the convolution's cuDNN graph (one kernel, not conv + cudnnAddTensor);
# ``cudnn_conv_algo_search`` picks the heuristic that chooses the engine (EXHAUSTIVE, ORT's
# default, is heuristic mode B; HEURISTIC is mode A).
FUSE_CONV_BIAS = ("fuse_conv_bias", "1")
ALGO_HEURISTIC = ("cudnn_conv_algo_search", "HEURISTIC")
# Attention kernels of the fused MultiHeadAttention/Attention ops (a bitmask of ORT's
# AttentionBackend; 0, the default, lets ORT choose among flash, memory-efficient and TensorRT's
# fused kernels): 8 adds cuDNN's flash attention, off by default; 2 keeps memory-efficient only.
# Values a build does not know fall back to ORT's unfused kernel, which simply loses on time.
SDPA_KERNELS = (("sdpa_kernel", "8"), ("sdpa_kernel", "2"))
# Short names for the label (the report's and the Triton comment's key for a profile).
_OPTION_LABELS = {FUSE_CONV_BIAS: "fcb", ALGO_HEURISTIC: "heur"}


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
    # Further execution-provider options as (key, value) pairs, sorted: what ORT's
    # provider-options dict and Triton's accelerator parameters take (e.g. fuse_conv_bias=1).
    provider_options: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        opts = tuple(sorted((str(k), str(v)) for k, v in self.provider_options))
        reserved = sorted({k for k, _ in opts} & _RESERVED_OPTIONS)
        if reserved:
            raise ValueError(f"provider_options may not set {', '.join(reserved)}: profile fields")
        if len({k for k, _ in opts}) != len(opts):
            raise ValueError(f"provider_options names a key twice: {opts}")
        object.__setattr__(self, "provider_options", opts)

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
        parts += [_OPTION_LABELS.get(kv, f"{kv[0]}={kv[1]}") for kv in self.provider_options]
        return "+".join(parts)

    def to_json(self) -> str:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["provider_options"] = dict(self.provider_options)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SessionProfile:
        d = json.loads(text)
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}  # newer writers may add fields
        d["notes"] = tuple(d.get("notes", ()))
        d["provider_options"] = tuple(dict(d.get("provider_options", {})).items())
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
    and for convolutional nets NHWC kernels, and the cuDNN levers on top of the graph profiles:
    the bias fused into each convolution (one kernel fewer per Conv), with either engine
    heuristic; for the others the attention-kernel choices (``SDPA_KERNELS``); on the CPU one
    configuration (ORT_ENABLE_ALL). Which one wins is the measurer's call: a lever that is
    slower on the target simply loses."""
    if target.provider != CUDA_EP:
        return [SessionProfile(provider=target.provider)]
    plain = SessionProfile(provider=CUDA_EP)
    graph = replace(plain, io_binding=True, cuda_graph=True)
    out = [plain, replace(plain, io_binding=True), graph]
    if not conv_model:
        return out + [replace(graph, provider_options=(kv,)) for kv in SDPA_KERNELS]
    nhwc = replace(graph, prefer_nhwc=True)
    return [
        *out,
        nhwc,
        replace(graph, provider_options=(FUSE_CONV_BIAS,)),
        replace(nhwc, provider_options=(FUSE_CONV_BIAS,)),
        replace(nhwc, provider_options=(FUSE_CONV_BIAS, ALGO_HEURISTIC)),
    ]


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
        # The backend hands every key of the "cuda" accelerator to ORT's CUDA provider options.
        params += list(profile.provider_options)
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
        algo = dict(profile.provider_options).get("cudnn_conv_algo_search")
        if gpu and algo is not None:
            # With model-level parameters present, the backend resets the algorithm search from
            # them (EXHAUSTIVE when absent), overriding the accelerator's key: say it here too.
            code = {"EXHAUSTIVE": 0, "HEURISTIC": 1, "DEFAULT": 2}.get(algo, algo)
            lines.append(
                'parameters { key: "cudnn_conv_algo_search" value: '
                f'{{ string_value: "{code}" }} }}'
            )
    if profile.io_binding:
        lines.append("# io_binding: Triton binds I/O itself; send inputs in CUDA shared memory")
    lines += [f"# note: {n}" for n in profile.notes]
    return "\n".join(lines) + "\n"
