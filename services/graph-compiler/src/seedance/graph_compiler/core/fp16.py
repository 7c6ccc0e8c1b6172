"""FP16 conversion that keeps models loadable, and an FP16 emulation that cannot be fooled.

Owns (1) the per-node FP16 plan (which nodes may run in FP16 and why not), (2) the converter
that applies it, and (3) the emulator that runs a graph node by node, rounding every FP16
node's inputs and outputs to float16 with numpy, so overflow to Inf shows up exactly where true
FP16 storage would produce it. ORT's CPU provider cannot be trusted for this: it casts FP16
back to FP32 and computes there, so a variance of 1e6 looks fine (research note, finding 4).

The converter handles what the stock one (onnxconverter-common / onnxruntime.transformers
float16) breaks on: unnamed nodes (we name them; casts get names from tensor names, which are
unique), explicit Cast(to=FLOAT) inside an FP16 region (retargeted to FLOAT16), a graph output
also read inside the graph (the producer writes a private FP16 tensor; the output is a Cast of
it), and inputs that must stay FP32 (Resize scales/roi). (4) ``safe_mask_fill``: an additive
attention mask's finfo(float32).min fill becomes -1e4, which FP16 holds. Must not run ORT for
numerics other than through the single-node sessions of the emulator, which come from the
injected ``SessionFactory``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from seedance.graph_compiler.core.passes import subgraph_reads
from seedance.graph_compiler.core.runtime import Session, SessionFactory

__all__ = [
    "FP16_MAX",
    "Fp16Emulator",
    "NodeFinding",
    "convert_to_fp16",
    "fp16_io",
    "fp16_plan",
    "name_nodes",
    "round_fp16",
    "safe_mask_fill",
]

FP16_MAX = 65504.0

# Ops whose float output type comes from an attribute or that have no FP16 kernel in the
# spec (Range: onnx/onnx#6757), and quantisation ops whose scales must stay FP32.
ALWAYS_FP32_OPS = frozenset(
    {
        "Range",
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "EyeLike",
        "Multinomial",
        "Bernoulli",
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "If",
        "Loop",
        "Scan",
    }
)
# (op, input index) that must stay FP32 inside an FP16 node: the converters' most reported
# load failure (Resize scales/roi, onnxconverter-common#306).
FP32_INPUTS = frozenset({("Resize", 1), ("Resize", 2), ("Upsample", 1)})
# Ops whose float output does not follow a float input; they are handled by attribute.
_TYPED_BY_ATTR = frozenset({"Cast", "Constant", "ConstantOfShape"})


def round_fp16(a: np.ndarray) -> np.ndarray:
    """Round a float32 array to the nearest float16 value (Inf past ±65504), kept as float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(np.float16).astype(np.float32)


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every node a unique name (a plan refers to nodes by name; stock converters derive
    Cast names from node names and collide on unnamed graphs)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    seen: set[str] = set()
    for i, node in enumerate(out.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)
    return out


def _is_f32(dtypes: Mapping[str, np.dtype], name: str) -> bool:
    return bool(name) and dtypes.get(name) == np.dtype(np.float32)


def fp16_plan(
    model: onnx.ModelProto, dtypes: Mapping[str, np.dtype], block: Mapping[str, str]
) -> dict[str, str | None]:
    """node name -> None if it runs in FP16, else the reason it stays FP32."""
    plan: dict[str, str | None] = {}
    for node in model.graph.node:
        if node.name in block:
            plan[node.name] = block[node.name]
        elif node.domain not in ("", "ai.onnx"):
            plan[node.name] = f"{node.domain} op kept in FP32"
        elif node.op_type in ALWAYS_FP32_OPS:
            plan[node.name] = f"{node.op_type} has no safe FP16 form"
        elif not any(_is_f32(dtypes, o) for o in node.output):
            plan[node.name] = "no float32 output"
        elif node.op_type not in _TYPED_BY_ATTR and not any(_is_f32(dtypes, i) for i in node.input):
            plan[node.name] = "float output not driven by a float input"
        else:
            plan[node.name] = None
    return plan


def _fp16_input(node: onnx.NodeProto, idx: int, dtypes: Mapping[str, np.dtype]) -> bool:
    return _is_f32(dtypes, node.input[idx]) and (node.op_type, idx) not in FP32_INPUTS


def _to_fp16_tensor(t: TensorProto, name: str | None = None) -> TensorProto:
    arr = numpy_helper.to_array(t)
    with np.errstate(over="ignore"):
        # Clip first: a weight past the FP16 range would become Inf, and a clipped weight is
        # what every FP16 deployment of this model computes with anyway.
        arr16 = np.clip(arr, -FP16_MAX, FP16_MAX).astype(np.float16)
    return numpy_helper.from_array(arr16, name if name is not None else t.name)


def convert_to_fp16(
    model: onnx.ModelProto, dtypes: Mapping[str, np.dtype], block: Mapping[str, str]
) -> onnx.ModelProto:
    """The model with every planned node in FP16; inputs and outputs keep their FP32 types."""
    plan = fp16_plan(model, dtypes, block)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    conv = _Converter(g, dtypes, {n.name: plan[n.name] is None for n in g.node})
    conv.initializers()
    for node in g.node:
        conv.node(node)
    nodes = _toposort(list(g.node) + conv.casts, g)
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]  # element types changed; ORT re-infers them
    return out


class _Converter:
    """The state of one conversion: where each float32 tensor lives after it (``home``: FLOAT
    or FLOAT16), the Casts added at the boundaries, and graph outputs renamed to private FP16
    tensors."""

    def __init__(
        self, g: onnx.GraphProto, dtypes: Mapping[str, np.dtype], is16: Mapping[str, bool]
    ) -> None:
        self.g = g
        self.dtypes = dtypes
        self.is16 = is16
        self.graph_outputs = {o.name for o in g.output}
        self.home: dict[str, int] = {
            vi.name: TensorProto.FLOAT for vi in g.input if _is_f32(dtypes, vi.name)
        }
        self.casts: list[onnx.NodeProto] = []
        self._cast_names: dict[tuple[str, int], str] = {}
        self._out_renames: dict[str, str] = {}

    def initializers(self) -> None:
        """FP32 initializers read only as FP16 inputs of FP16 nodes become FP16."""
        g = self.g
        consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for node in g.node:
            for i, name in enumerate(node.input):
                consumers.setdefault(name, []).append((node, i))
            for name in subgraph_reads(node):
                consumers.setdefault(name, []).append((node, -1))
        new_inits = []
        for init in g.initializer:
            if init.data_type != TensorProto.FLOAT:
                new_inits.append(init)
                continue
            users = consumers.get(init.name, [])
            if (
                users
                and all(
                    i >= 0 and self.is16[n.name] and _fp16_input(n, i, self.dtypes)
                    for n, i in users
                )
                and init.name not in self.graph_outputs
            ):
                new_inits.append(_to_fp16_tensor(init))
                self.home[init.name] = TensorProto.FLOAT16
            else:
                new_inits.append(init)
                self.home[init.name] = TensorProto.FLOAT
        del g.initializer[:]
        g.initializer.extend(new_inits)

    def cast(self, name: str, to: int) -> str:
        key = (name, to)
        if key not in self._cast_names:
            suffix = "fp16" if to == TensorProto.FLOAT16 else "fp32"
            new = f"{name}__{suffix}"
            self._cast_names[key] = new
            self.casts.append(helper.make_node("Cast", [name], [new], name=f"{new}__cast", to=to))
        return self._cast_names[key]

    def node(self, node: onnx.NodeProto) -> None:
        fp16 = self.is16[node.name]
        self._inputs(node, fp16)
        if fp16:
            _retype_attrs(node)
        self._outputs(node, fp16)
        # Subgraphs (only in FP32 nodes) read captured tensors as FP32.
        for captured in subgraph_reads(node):
            if self.home.get(captured) == TensorProto.FLOAT16:
                fp32 = self.cast(captured, TensorProto.FLOAT)
                _rename_captured(node, captured, fp32)

    def _inputs(self, node: onnx.NodeProto, fp16: bool) -> None:
        for i, name in enumerate(node.input):
            name = self._out_renames.get(name, name)
            node.input[i] = name
            if not _is_f32(self.dtypes, name) or name not in self.home:
                continue
            fp16_in = fp16 and _fp16_input(node, i, self.dtypes)
            want = TensorProto.FLOAT16 if fp16_in else TensorProto.FLOAT
            if self.home[name] != want:
                node.input[i] = self.cast(name, want)

    def _outputs(self, node: onnx.NodeProto, fp16: bool) -> None:
        for j, name in enumerate(node.output):
            if not _is_f32(self.dtypes, name):
                continue
            if not fp16:
                self.home[name] = TensorProto.FLOAT
            elif name in self.graph_outputs:
                # A graph output must stay FP32 and may be read inside the graph too: the
                # producer writes a private FP16 tensor and the output becomes a Cast of it.
                private = f"{name}__fp16out"
                node.output[j] = private
                self._out_renames[name] = private
                self.home[private] = TensorProto.FLOAT16
                self.dtypes = {**self.dtypes, private: np.dtype(np.float32)}
                self.casts.append(
                    helper.make_node(
                        "Cast", [private], [name], name=f"{name}__out_cast", to=TensorProto.FLOAT
                    )
                )
            else:
                self.home[name] = TensorProto.FLOAT16


def _retype_attrs(node: onnx.NodeProto) -> None:
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
            attr.i = TensorProto.FLOAT16
        elif (
            node.op_type in ("Constant", "ConstantOfShape")
            and attr.name == "value"
            and (attr.t.data_type == TensorProto.FLOAT)
        ):
            attr.t.CopyFrom(_to_fp16_tensor(attr.t, attr.t.name))
        elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
            arr = np.array(attr.f if attr.name == "value_float" else list(attr.floats), np.float32)
            node.attribute.remove(attr)
            node.attribute.append(
                helper.make_attribute("value", numpy_helper.from_array(arr.astype(np.float16)))
            )
            return
    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        node.attribute.append(
            helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float16)))
        )


def _rename_captured(node: onnx.NodeProto, old: str, new: str) -> None:
    for attr in node.attribute:
        for sub in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
            for n in sub.node:
                for i, name in enumerate(n.input):
                    if name == old:
                        n.input[i] = new
                _rename_captured(n, old, new)


def _toposort(nodes: list[onnx.NodeProto], g: onnx.GraphProto) -> list[onnx.NodeProto]:
    ready = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    pending = list(nodes)
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for node in pending:
            needs = set(node.input) | subgraph_reads(node)
            needs -= set(node.output)
            if needs <= ready or all(n in ready or not _produced(n, pending) for n in needs):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # a cycle cannot come from a valid graph; keep order
            ordered.extend(rest)
            break
        pending = rest
    return ordered


def _produced(name: str, nodes: Sequence[onnx.NodeProto]) -> bool:
    return any(name in n.output for n in nodes)


# ---------------------------------------------------------------------------- emulation


@dataclass(frozen=True, kw_only=True)
class NodeFinding:
    """What FP16 storage does at one node, over all samples."""

    node: str
    op_type: str
    ref_max_abs: float  # largest |value| among the node's float inputs/outputs in FP32
    nonfinite: int  # non-finite output values in the emulation where FP32 was finite
    rel_err: float  # ‖emu − ref‖ / ‖ref‖ over the node's float outputs


class Fp16Emulator:
    """Runs a model node by node on ``sessions`` (ORT's CPU provider) in FP32, rounding the
    inputs and outputs of FP16 nodes to float16 with numpy between nodes. Each node's session
    is built once."""

    def __init__(self, model: onnx.ModelProto, sessions: SessionFactory) -> None:
        self._model = model
        self._factory = sessions
        self._sessions: dict[str, Session] = {}
        self._inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self._opsets = list(model.opset_import)

    def _session(self, node: onnx.NodeProto, env: Mapping[str, np.ndarray]) -> Session:
        sess = self._sessions.get(node.name)
        if sess is None:
            names = [n for n in dict.fromkeys([*node.input, *subgraph_reads(node)]) if n in env]
            inputs = [
                helper.make_tensor_value_info(
                    n, helper.np_dtype_to_tensor_dtype(env[n].dtype), env[n].shape
                )
                for n in names
            ]
            outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
            g = helper.make_graph([node], f"node_{node.name}", inputs, outputs)
            m = helper.make_model(g, opset_imports=self._opsets, ir_version=self._model.ir_version)
            sess = self._factory.session(m, "disable", threads=2)
            self._sessions[node.name] = sess
        return sess

    def run(
        self, feeds: Mapping[str, np.ndarray], plan: Mapping[str, str | None] | None
    ) -> dict[str, np.ndarray]:
        """Every tensor's value. ``plan`` None runs plain FP32 (the reference)."""
        env: dict[str, np.ndarray] = {**self._inits, **feeds}
        for node in self._model.graph.node:
            fp16 = plan is not None and plan.get(node.name, "") is None
            sess = self._session(node, env)
            run_feeds = {}
            for inp in sess.input_names:
                value = env[inp]
                idx = list(node.input).index(inp) if inp in node.input else -1
                if fp16 and value.dtype == np.float32 and (node.op_type, idx) not in FP32_INPUTS:
                    value = round_fp16(value)
                run_feeds[inp] = value
            results = sess.run(run_feeds)
            outs = [o for o in node.output if o]
            for name, value in zip(outs, results, strict=True):
                value = np.asarray(value)
                if fp16 and value.dtype == np.float32:
                    value = round_fp16(value)
                env[name] = value
        return env

    def dtypes(self, env: Mapping[str, np.ndarray]) -> dict[str, np.dtype]:
        return {k: np.asarray(v).dtype for k, v in env.items()}

    def findings(
        self,
        refs: Sequence[Mapping[str, np.ndarray]],
        emus: Sequence[Mapping[str, np.ndarray]],
    ) -> list[NodeFinding]:
        found = []
        for node in self._model.graph.node:
            ref_max, bad, num, den = 0.0, 0, 0.0, 0.0
            for ref, emu in zip(refs, emus, strict=True):
                for name in [*node.input, *node.output]:
                    v = ref.get(name)
                    if v is not None and v.dtype == np.float32 and v.size:
                        ref_max = max(ref_max, float(np.max(np.abs(v[np.isfinite(v)]), initial=0)))
                for name in node.output:
                    r, e = ref.get(name), emu.get(name)
                    if r is None or e is None or r.dtype != np.float32:
                        continue
                    finite = np.isfinite(r)
                    bad += int(np.count_nonzero(finite & ~np.isfinite(e)))
                    ok = finite & np.isfinite(e)
                    num += float(np.sum((e[ok].astype(np.float64) - r[ok]) ** 2))
                    den += float(np.sum(r[ok].astype(np.float64) ** 2))
            found.append(
                NodeFinding(
                    node=node.name,
                    op_type=node.op_type,
                    ref_max_abs=ref_max,
                    nonfinite=bad,
                    rel_err=float(np.sqrt(num / den)) if den > 0 else 0.0,
                )
            )
        return found


# A masked logit only has to make exp() underflow: -1e4 does that in FP16 as in FP32 (exp(-1e4)
# is 0 in both), while finfo(float32).min cannot be represented in FP16 and forces the whole
# mask path (and every attention Softmax it feeds) to stay in FP32.
_MASK_FILL = -1.0e4
_MASK_LIMIT = 1.0e30


# What an additive mask may pass through on its way to the Softmax it masks.
_MASK_PATH_OPS = frozenset({"Mul", "Add", "Sub", "Where", "Expand", "Cast", "Unsqueeze"})


def _readers(g: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """tensor name -> the nodes that read it, in graph order."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _reaches_softmax(
    consumers: Mapping[str, list[onnx.NodeProto]], tensor: str, depth: int = 0
) -> bool:
    if depth > 4:
        return False
    for n in consumers.get(tensor, []):
        if n.op_type == "Softmax":
            return True
        if n.op_type not in _MASK_PATH_OPS:
            return False
        if not all(_reaches_softmax(consumers, o, depth + 1) for o in n.output):
            return False
    return bool(consumers.get(tensor))


def safe_mask_fill(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Scalar float initializers of magnitude ≥ 1e30 whose value reaches a Softmax only through
    Mul/Add/Sub/Where (an additive attention mask built as ``(1 - mask) * finfo.min``) become
    -1e4, so the FP16 plan can keep attention in FP16. Returns the model and the names changed.
    Softmax outputs are unchanged to FP32 precision wherever at least one position is
    unmasked; the FP16 candidate's accuracy check against the unchanged FP32 model is what
    lets it through."""
    consumers = _readers(model.graph)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    changed = []
    for i, init in enumerate(out.graph.initializer):
        if init.data_type != onnx.TensorProto.FLOAT or np.prod(init.dims, dtype=np.int64) != 1:
            continue
        value = float(numpy_helper.to_array(init).reshape(()))
        if abs(value) >= _MASK_LIMIT and value < 0 and _reaches_softmax(consumers, init.name):
            arr = np.full(tuple(init.dims), _MASK_FILL, np.float32)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, init.name))
            changed.append(init.name)
    return out, changed


def fp16_io(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The converted model with FP16 graph inputs and outputs where its only use of an FP32
    input is a Cast to FLOAT16, or an FP32 output is a Cast from an FP16 tensor: the casts at
    the edges go, and with them half of the bytes copied per request. Callers then feed and
    read float16 (the deployment profile's ``io_dtype`` says so). Returns the model and the
    names of the inputs/outputs changed (empty: nothing to change)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    users = _readers(g)
    drop: set[int] = set()
    rename: dict[str, str] = {}
    changed = _fp16_graph_inputs(g, users, drop, rename)
    changed += _fp16_graph_outputs(g, users, drop, rename)
    if not changed:
        return model, []
    kept = [n for n in g.node if id(n) not in drop]
    for n in kept:
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
    del g.node[:]
    g.node.extend(kept)
    for vi in list(g.value_info):
        if vi.name in rename or vi.name in {o.name for o in g.output}:
            g.value_info.remove(vi)
    return out, changed


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _fp16_graph_inputs(
    g: onnx.GraphProto,
    users: Mapping[str, list[onnx.NodeProto]],
    drop: set[int],
    rename: dict[str, str],
) -> list[str]:
    """FP32 inputs read only by Casts to FLOAT16 become FLOAT16; the Casts go (into ``drop``,
    their outputs renamed to the input). Returns the inputs changed."""
    changed = []
    for vi in g.input:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        readers = users.get(vi.name, [])
        if not readers or any(_cast_to(n) != TensorProto.FLOAT16 for n in readers):
            continue
        for n in readers:
            rename[n.output[0]] = vi.name
            drop.add(id(n))
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
        changed.append(vi.name)
    return changed


def _fp16_graph_outputs(
    g: onnx.GraphProto,
    users: Mapping[str, list[onnx.NodeProto]],
    drop: set[int],
    rename: dict[str, str],
) -> list[str]:
    """FP32 outputs that are a Cast of a private FP16 tensor become FLOAT16: its producer
    writes the output directly and the Cast goes. Returns the outputs changed."""
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    changed = []
    for vo in g.output:
        node = producer.get(vo.name)
        if node is None or _cast_to(node) != TensorProto.FLOAT:
            continue
        src = node.input[0]
        src_node = producer.get(src)
        # The FP16 tensor must be private to the cast (not a graph input or another output),
        # so its producer can write the output's name directly.
        if src_node is None or src in outputs or len(users.get(src, [])) != 1:
            continue
        src_node.output[list(src_node.output).index(src)] = vo.name
        rename[src] = vo.name  # no reader left; its value_info goes below
        drop.add(id(node))
        vo.type.tensor_type.elem_type = TensorProto.FLOAT16
        changed.append(vo.name)
    return changed
