"""Helpers for the graph compiler's tests: build small ONNX graphs, run them in real ORT."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes, inputs, outputs, inits=(), opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def run_ort(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of a real ORT session with no ORT optimisation, so a pass is judged alone."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def overflow_ln_model() -> onnx.ModelProto:
    """A decomposed LayerNorm whose inputs are scaled ×1000 inside the graph: the variance is
    ~1e6, past FP16's 65504, so true FP16 arithmetic gives Inf → output collapses, while ORT
    CPU (which computes an FP16 model in FP32) shows nothing wrong (research note, finding 4)."""
    rng = np.random.default_rng(1)
    d = 64
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["xs"], name="scale"),
        helper.make_node("ReduceMean", ["xs"], ["mean"], name="mean", axes=[-1]),
        helper.make_node("Sub", ["xs", "mean"], ["xc"], name="center"),
        helper.make_node("Pow", ["xc", "two"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="variance", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="std"),
        helper.make_node("Div", ["xc", "sd"], ["xn"], name="normalise"),
        helper.make_node("MatMul", ["xn", "W"], ["y"], name="proj"),
    ]
    inits = [
        init("k", np.array(1000.0, np.float32)),
        init("two", np.array(2.0, np.float32)),
        init("eps", np.array(1e-5, np.float32)),
        init("W", (rng.standard_normal((d, 16)) / 8).astype(np.float32)),
    ]
    return make_model(nodes, [f32("x", [4, d])], [f32("y", [4, 16])], inits)


class StandInMeasurer:
    """A ``Measurer`` for tests of the choice: outputs come from ORT's CPU provider, times are
    scripted per candidate (``times_ms["int8"]``, ...; ``"baseline"`` too) and shortened by the
    profile's IO binding / CUDA graph, so a test states which candidate is faster where. It can
    claim to be a GPU (``provider``), which no real code path here can."""

    def __init__(
        self, times_ms, provider="CPUExecutionProvider", int8_accelerated=True, profile_ms=None
    ):
        from seedance.graph_compiler.core.profile import TargetInfo

        self.times_ms = dict(times_ms)
        # Scripted extra time per part of a profile's label ("fcb": -0.05 makes the fused
        # convolution bias faster), on top of IO binding's and CUDA graphs' gains.
        self.profile_ms = dict(profile_ms or {})
        self.timed: list[str] = []
        self._target = TargetInfo(
            provider=provider, machine=f"stand-in {provider}", int8_accelerated=int8_accelerated
        )

    @property
    def target(self):
        return self._target

    def time(self, variants, feeds):
        from types import SimpleNamespace

        out = {}
        for name, _, profile in variants:
            self.timed.append(name)
            cand = name.split("@")[0]
            # fp16_fused takes fp16's time unless scripted (a tie goes to the plain candidate)
            ms = self.times_ms.get(cand, self.times_ms.get(cand.split("_")[0], 0.0))
            ms -= 0.1 * profile.io_binding + 0.2 * profile.cuda_graph
            ms += sum(self.profile_ms.get(part, 0.0) for part in profile.label.split("+"))
            out[name] = SimpleNamespace(median_ms=ms, error=None)
        return out

    def outputs(self, model, profile, feeds):
        from seedance.graph_compiler.measuring import ProfiledRunner

        # The real runner on the CPU provider: it converts feeds to float16-I/O inputs too.
        runner = ProfiledRunner(model, {"provider": "CPUExecutionProvider", "opt_level": "disable"})
        return [runner.run(f) for f in feeds]


def external_data_model(location: str, weights: np.ndarray) -> onnx.ModelProto:
    """A 4x4 MatMul whose one initializer ``W`` names ``location`` as its external data (the
    bytes of ``weights``, float32), for the tests of what a compile may read."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 4], vals=weights.ravel())
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    length = str(weights.astype(np.float32).nbytes)
    for key, value in (("location", location), ("offset", "0"), ("length", length)):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# --- hostile models (a tenant's few hundred bytes that cost the compiler time or memory) -------


def _hostile(nodes, inits=(), inputs=None, outputs=None) -> onnx.ModelProto:
    inputs = inputs or [f32("x", [1, 4])]
    outputs = outputs or [f32("y", [1, 4])]
    model = make_model(nodes, inputs, outputs, inits)
    model.ir_version = 8
    return model


def loop_forever_model() -> onnx.ModelProto:
    """~300 bytes: a ``Loop`` with trip count 2^62 and an ``Add`` in its body. It passes the
    checker and shape inference, and runs until something stops it."""
    return loop_model(2**62)


def loop_trips_for(seconds: float) -> int:
    """The trip count at which one run of ``loop_model`` takes about ``seconds`` on this
    machine now, run as the compile runs its reference (measured, as the review tuned its
    model to run just under the bound; the fastest of 3 runs, so load makes runs longer)."""
    import time

    from seedance.graph_compiler.sessions import make_session

    trips = 20_000
    sess = make_session(loop_model(trips), "disable", threads=2)
    feeds = {"x": np.zeros((1, 4), np.float32)}
    sess.run(feeds)  # the first run allocates
    took = []
    for _ in range(3):
        started = time.perf_counter()
        sess.run(feeds)
        took.append(time.perf_counter() - started)
    return max(1, int(trips * seconds / min(took)))


def loop_model(trips: int) -> onnx.ModelProto:
    """A ``Loop`` of ``trips`` iterations with an ``Add`` in its body: each run of it takes as
    long as its trip count says, however small the model."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            f32("v_in", [1, 4]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), f32("v_out", [1, 4])],
        initializer=[init("one", np.ones((1, 4), np.float32))],
    )
    inits = [init("M", np.array(trips, np.int64)), init("c", np.array(True))]
    return _hostile([helper.make_node("Loop", ["M", "c", "x"], ["y"], body=body)], inits)


def huge_dim_model() -> onnx.ModelProto:
    """A Relu whose declared input is [2^40, 2^40] floats."""
    return _hostile([helper.make_node("Relu", ["x"], ["y"])], inputs=[f32("x", [1 << 40, 1 << 40])])


def big_input_model(n: int) -> onnx.ModelProto:
    """A declared input of ``n`` floats, summed: the calibration samples are what cost."""
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    return _hostile(nodes, inputs=[f32("x", [1, n])], outputs=[f32("y", [1, 1])])


def big_alloc_model(n: int) -> onnx.ModelProto:
    """~190 bytes: ``ConstantOfShape`` of ``n`` floats reduced to a scalar added to ``x``."""
    value = numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], value=value),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    return _hostile(nodes, [init("shape", np.array([n], np.int64))])


def relu_chain_model(n: int) -> onnx.ModelProto:
    """``n`` Relu nodes in a chain."""
    nodes = [
        helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}" if i < n - 1 else "y"])
        for i in range(n)
    ]
    return _hostile(nodes)
