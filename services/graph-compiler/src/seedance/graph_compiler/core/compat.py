"""Compatibility check of a model against a deployment target, naming every offending node.

Owns the target descriptions (opset range, operator whitelist per domain, required inputs and
their static shapes, the 2 GB external-data boundary) and the report. The opset is read from
the file, never taken from the request: exporters do not always honour the opset they were
asked for (research note, finding 10). Must not modify the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import external_data_helper

from seedance.graph_compiler.core.errors import InvalidModel
from seedance.graph_compiler.core.external_data import external_location, external_tensors, locate
from seedance.graph_compiler.core.loading import PROTOBUF_LIMIT_BYTES, all_node_count

__all__ = [
    "ORT_CPU",
    "TRANSFORMER_GPU",
    "CompatProblem",
    "CompatReport",
    "CompatTarget",
    "check_compatibility",
]


@dataclass(frozen=True, kw_only=True)
class CompatTarget:
    name: str
    min_opset: int
    max_opset: int
    # domain ("" is the default ONNX domain) -> allowed op types; a domain absent is refused.
    allowed_ops: Mapping[str, frozenset[str]]
    # input name -> required static shape (None: any static shape).
    required_inputs: Mapping[str, tuple[int, ...] | None] = field(default_factory=dict)
    optional_inputs: frozenset[str] = frozenset()
    require_static_shapes: bool = True
    # Most nodes, subgraphs' included (0: no bound); the service sets it from ``max_nodes``.
    max_nodes: int = 0


@dataclass(frozen=True, kw_only=True)
class CompatProblem:
    kind: str  # opset | operator | input_name | input_shape | external_data | nodes
    message: str
    node: str = ""  # the offending node's name, where one is to blame
    op_type: str = ""


@dataclass(frozen=True, kw_only=True)
class CompatReport:
    target: str
    opset: int
    ir_version: int
    weight_bytes: int
    external_data: bool
    problems: tuple[CompatProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def offending_nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.problems if p.node)


# What a transformer encoder export needs, including the mask-building subgraph HF exports
# carry (ConstantOfShape/Where/Expand/Equal...), and nothing exotic. A GPU engine's parser
# whitelist of this kind is where ops like Loop/NonZero/Unique fail to build.
_TRANSFORMER_OPS = frozenset(
    {
        "Add",
        "And",
        "Cast",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Div",
        "Equal",
        "Erf",
        "Expand",
        "Flatten",
        "Gather",
        "GatherND",
        "Gemm",
        "Greater",
        "GreaterOrEqual",
        "Identity",
        "LayerNormalization",
        "Less",
        "MatMul",
        "Mul",
        "Neg",
        "Not",
        "Pow",
        "Range",
        "ReduceMean",
        "Relu",
        "Reshape",
        "Shape",
        "Slice",
        "Softmax",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Tanh",
        "Transpose",
        "Unsqueeze",
        "Where",
        "Sigmoid",
        "Gelu",
        "Split",
        "Tile",
        "Dropout",
        "Clip",
    }
)

TRANSFORMER_GPU = CompatTarget(
    name="transformer-gpu",
    min_opset=13,
    max_opset=18,
    allowed_ops={"": _TRANSFORMER_OPS, "ai.onnx": _TRANSFORMER_OPS},
    required_inputs={"input_ids": None, "attention_mask": None},
    optional_inputs=frozenset({"token_type_ids", "position_ids"}),
)


def _all_onnx_ops() -> frozenset[str]:
    return frozenset(s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx"))


ORT_CPU = CompatTarget(
    name="ort-cpu",
    min_opset=7,
    max_opset=onnx.defs.onnx_opset_version(),
    allowed_ops={"": _all_onnx_ops(), "ai.onnx": _all_onnx_ops()},
    require_static_shapes=False,
)


def _external_problem(t: onnx.TensorProto, base_dir: Path | None) -> str | None:
    """What is wrong with ``t``'s external data: a location leading out of the model's
    directory (judged before the filesystem is touched, one message whether or not a file is
    there), or, inside it, a missing file or one too short."""
    location = external_location(t)
    try:
        path = locate(base_dir, t.name, location)
    except InvalidModel as exc:
        return str(exc)
    if path is None:  # a proto in memory: no directory to look in
        return None
    if not path.is_file():
        return f"initializer {t.name!r} points at missing file {location!r}"
    info = external_data_helper.ExternalDataInfo(t)
    if info.length and path.stat().st_size < int(info.offset or 0) + int(info.length):
        return f"initializer {t.name!r} runs past the end of {location!r}"
    return None


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _parse(model: onnx.ModelProto | str | Path) -> tuple[onnx.ModelProto, Path | None]:
    """The proto, and the directory its external data is judged against (None: in memory)."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    path = Path(model)
    if not path.is_file():
        raise InvalidModel(f"model path {str(path)!r} is not a file")
    try:
        return onnx.load(str(path), load_external_data=False), path.parent
    except Exception as exc:  # protobuf DecodeError and friends
        raise InvalidModel(f"cannot parse ONNX model: {exc}") from exc


def _node_problems(model: onnx.ModelProto, target: CompatTarget) -> list[CompatProblem]:
    n = all_node_count(model)
    if not target.max_nodes or n <= target.max_nodes:
        return []
    return [
        CompatProblem(
            kind="nodes",
            message=f"model has {n:,} nodes (subgraphs included), over the compiler's "
            f"max_nodes of {target.max_nodes:,}",
        )
    ]


def _opset_problems(opset: int, target: CompatTarget) -> list[CompatProblem]:
    if target.min_opset <= opset <= target.max_opset:
        return []
    return [
        CompatProblem(
            kind="opset",
            message=f"model opset {opset} (read from the file) outside "
            f"[{target.min_opset}, {target.max_opset}] for {target.name}",
        )
    ]


def _operator_problems(model: onnx.ModelProto, target: CompatTarget) -> list[CompatProblem]:
    problems = []
    for index, node in enumerate(model.graph.node):
        allowed = target.allowed_ops.get(node.domain)
        if allowed is None or node.op_type not in allowed:
            dom = node.domain or "ai.onnx"
            problems.append(
                CompatProblem(
                    kind="operator",
                    message=f"{dom}::{node.op_type} is not supported by {target.name}",
                    node=node.name or f"<unnamed {node.op_type} #{index}>",
                    op_type=node.op_type,
                )
            )
    return problems


def _input_problems(
    inputs: Mapping[str, onnx.ValueInfoProto], target: CompatTarget
) -> list[CompatProblem]:
    """Required inputs missing or of the wrong shape, and inputs the target does not take."""
    problems = []
    for name, want in target.required_inputs.items():
        if name not in inputs:
            problems.append(
                CompatProblem(
                    kind="input_name",
                    message=f"required input {name!r} missing; model inputs: {sorted(inputs)}",
                )
            )
            continue
        dims = inputs[name].type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims)
        if want is not None and shape != want:
            problems.append(
                CompatProblem(
                    kind="input_shape", message=f"input {name!r} has shape {shape}, need {want}"
                )
            )
    if target.required_inputs:
        extra = set(inputs) - set(target.required_inputs) - target.optional_inputs
        problems.extend(
            CompatProblem(kind="input_name", message=f"unexpected input {n!r}")
            for n in sorted(extra)
        )
    return problems


def _static_problems(inputs: Mapping[str, onnx.ValueInfoProto]) -> list[CompatProblem]:
    problems = []
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        symbolic = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
        if symbolic or not vi.type.tensor_type.HasField("shape"):
            problems.append(
                CompatProblem(
                    kind="input_shape",
                    message=f"input {name!r} is not static (symbolic dims {symbolic}); "
                    "pin it before compiling",
                )
            )
    return problems


def _weights(
    model: onnx.ModelProto, base_dir: Path | None
) -> tuple[int, bool, list[CompatProblem]]:
    """The weights' bytes, whether any tensor keeps its data outside the proto, and what is
    wrong with where they are kept."""
    weight_bytes, external = 0, False
    for t in model.graph.initializer:
        if external_data_helper.uses_external_data(t):
            external = True
            weight_bytes += int(external_data_helper.ExternalDataInfo(t).length or 0)
        else:
            weight_bytes += len(t.raw_data) or t.ByteSize()
    problems = []
    # Every tensor that names a file, not only the initializers: all of them get loaded.
    for t in external_tensors(model):
        external = True
        problem = _external_problem(t, base_dir)
        if problem is not None:
            problems.append(CompatProblem(kind="external_data", message=problem))
    if weight_bytes >= PROTOBUF_LIMIT_BYTES and not external:
        problems.append(
            CompatProblem(
                kind="external_data",
                message=f"{weight_bytes / 2**30:.2f} GiB of weights inline: over the 2 GB protobuf "
                "limit, save with external data",
            )
        )
    return weight_bytes, external, problems


def check_compatibility(model: onnx.ModelProto | str | Path, target: CompatTarget) -> CompatReport:
    """Check ``model`` (a proto, or a path whose external data is checked without loading it)."""
    proto, base_dir = _parse(model)
    opset = _opset(proto)
    inits = {i.name for i in proto.graph.initializer}
    inputs = {vi.name: vi for vi in proto.graph.input if vi.name not in inits}
    problems = _node_problems(proto, target)
    problems += _opset_problems(opset, target) + _operator_problems(proto, target)
    problems += _input_problems(inputs, target)
    if target.require_static_shapes:
        problems += _static_problems(inputs)
    weight_bytes, external, weight_problems = _weights(proto, base_dir)
    return CompatReport(
        target=target.name,
        opset=opset,
        ir_version=proto.ir_version,
        weight_bytes=weight_bytes,
        external_data=external,
        problems=tuple(problems + weight_problems),
    )
