"""Build the graph-compiler's benchmark models with random weights, without torch.

Writes ResNet-50 v1.5 (224×224, BatchNorm folded into Conv the way today's exporters do, or left
in with ``--with-bn``) and a BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, vocab
30522, seq 128, outputs ``last_hidden_state`` and ``pooler_output``) as plain ONNX opset-17 graphs
built with ``onnx.helper``. The BERT graph follows the TorchScript export's layout (MatMul+Add
projections, Reshape/Transpose heads, Div by sqrt(d), additive mask from ``attention_mask``, Erf
GELU, LayerNormalization, pooler on token 0 of an output that is also a graph output), so the
passes and the FP16 converter meet the same shapes they meet on a real export.

Usage: python tools/gen/make_models.py [--out build/models] [--only resnet50|bert] [--with-bn]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    """Collects nodes and initializers with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        name = self.name(op)
        outs = [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def one(self, op: str, inputs: list[str], **attrs: Any) -> str:
        return self.node(op, inputs, **attrs)[0]


def _conv(
    b: _Builder,
    x: str,
    c_in: int,
    c_out: int,
    k: int,
    stride: int,
    with_bn: bool,
    gain: float = 1.0,
) -> str:
    fan_in = c_in * k * k
    w = (b.rng.standard_normal((c_out, c_in, k, k)) * gain * np.sqrt(2.0 / fan_in)).astype(
        np.float32
    )
    pad = k // 2
    attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4}
    if not with_bn:
        bias = (b.rng.standard_normal(c_out) * 0.05).astype(np.float32)
        return b.one("Conv", [x, b.const("W", w), b.const("B", bias)], **attrs)
    y = b.one("Conv", [x, b.const("W", w)], **attrs)
    scale = b.rng.uniform(0.5, 1.5, c_out).astype(np.float32)
    shift = (b.rng.standard_normal(c_out) * 0.05).astype(np.float32)
    mean = (b.rng.standard_normal(c_out) * 0.05).astype(np.float32)
    var = b.rng.uniform(0.5, 1.5, c_out).astype(np.float32)
    return b.one(
        "BatchNormalization",
        [y, b.const("g", scale), b.const("b", shift), b.const("m", mean), b.const("v", var)],
        epsilon=1e-5,
    )


def build_resnet50(with_bn: bool = False, seed: int = 0) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.one("Relu", [_conv(b, "input", 3, 64, 7, 2, with_bn)])
    x = b.one("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            h = b.one("Relu", [_conv(b, x, c_in, width, 1, 1, with_bn)])
            h = b.one("Relu", [_conv(b, h, width, width, 3, s, with_bn)])
            # The last conv of a block starts small (zero-init-gamma style) so the residual
            # stream stays in a realistic range over 16 blocks.
            h = _conv(b, h, width, width * 4, 1, 1, with_bn, gain=0.3)
            short = _conv(b, x, c_in, width * 4, 1, s, with_bn) if i == 0 else x
            x = b.one("Relu", [b.one("Add", [h, short])])
            c_in = width * 4
    x = b.one("GlobalAveragePool", [x])
    x = b.one("Flatten", [x], axis=1)
    w = (b.rng.standard_normal((1000, 2048)) * 0.02).astype(np.float32)
    bias = np.zeros(1000, np.float32)
    b.nodes.append(
        helper.make_node(
            "Gemm", [x, b.const("fc_W", w), b.const("fc_B", bias)], ["logits"], name="fc", transB=1
        )
    )
    graph = helper.make_graph(
        b.nodes,
        "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])],
        b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def build_bert(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    vocab: int = 30522,
    seq: int = 128,
    seed: int = 0,
) -> onnx.ModelProto:
    b = _Builder(seed)
    head_dim = hidden // heads

    def w(*shape: int) -> str:
        return b.const("W", (b.rng.standard_normal(shape) * 0.02).astype(np.float32))

    def zeros(n: int) -> str:
        return b.const("B", np.zeros(n, np.float32))

    def ln(x: str) -> str:
        return b.one(
            "LayerNormalization",
            [x, b.const("ln_g", np.ones(hidden, np.float32)), zeros(hidden)],
            axis=-1,
            epsilon=1e-12,
        )

    def linear(x: str, n_in: int, n_out: int) -> str:
        return b.one("Add", [b.one("MatMul", [x, w(n_in, n_out)]), zeros(n_out)])

    shape_heads = b.const("shape", np.array([1, seq, heads, head_dim], np.int64))
    shape_back = b.const("shape", np.array([1, seq, hidden], np.int64))

    emb = b.one("Gather", [w(vocab, hidden), "input_ids"])
    pos = b.one(
        "Gather", [w(512, hidden), b.const("pos_ids", np.arange(seq, dtype=np.int64)[None])]
    )
    typ = b.one("Gather", [w(2, hidden), "token_type_ids"])
    x = ln(b.one("Add", [b.one("Add", [emb, pos]), typ]))

    # Additive mask as transformers builds it: (1 - mask) * finfo(float32).min, shape 1×1×1×seq.
    m = b.one("Unsqueeze", ["attention_mask", b.const("axes", np.array([1, 2], np.int64))])
    m = b.one("Cast", [m], to=TensorProto.FLOAT)
    m = b.one("Sub", [b.const("one", np.array(1.0, np.float32)), m])
    mask = b.one("Mul", [m, b.const("minf", np.array(np.finfo(np.float32).min, np.float32))])

    scale = b.const("sqrt_d", np.array(np.sqrt(head_dim), np.float32))
    for _ in range(layers):

        def heads_of(t: str, perm: list[int]) -> str:
            return b.one("Transpose", [b.one("Reshape", [t, shape_heads])], perm=perm)

        q = heads_of(linear(x, hidden, hidden), [0, 2, 1, 3])
        k = heads_of(linear(x, hidden, hidden), [0, 2, 3, 1])
        v = heads_of(linear(x, hidden, hidden), [0, 2, 1, 3])
        s = b.one("Div", [b.one("MatMul", [q, k]), scale])
        p = b.one("Softmax", [b.one("Add", [s, mask])], axis=-1)
        ctx = b.one("Transpose", [b.one("MatMul", [p, v])], perm=[0, 2, 1, 3])
        ctx = b.one("Reshape", [ctx, shape_back])
        x = ln(b.one("Add", [linear(ctx, hidden, hidden), x]))
        h = linear(x, hidden, ffn)
        erf = b.one(
            "Erf", [b.one("Div", [h, b.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])]
        )
        g = b.one("Add", [erf, b.const("one", np.array(1.0, np.float32))])
        g = b.one("Mul", [b.one("Mul", [h, g]), b.const("half", np.array(0.5, np.float32))])
        x = ln(b.one("Add", [linear(g, ffn, hidden), x]))

    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="out_identity"))
    first = b.one("Gather", ["last_hidden_state", b.const("idx0", np.array(0, np.int64))], axis=1)
    pooled = b.one("Gemm", [first, w(hidden, hidden), zeros(hidden)])
    b.nodes.append(helper.make_node("Tanh", [pooled], ["pooler_output"], name="pooler_tanh"))
    int_in = [
        helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    graph = helper.make_graph(
        b.nodes,
        "bert_base",
        int_in,
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden]),
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, [1, hidden]),
        ],
        b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/models"))
    ap.add_argument("--only", choices=["resnet50", "bert"])
    ap.add_argument("--with-bn", action="store_true", help="also write resnet50_bn.onnx")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    todo = []
    if args.only in (None, "resnet50"):
        todo.append(("resnet50", lambda: build_resnet50(False)))
        if args.with_bn:
            todo.append(("resnet50_bn", lambda: build_resnet50(True)))
    if args.only in (None, "bert"):
        todo.append(("bert_base", build_bert))
    for name, build in todo:
        model = build()
        onnx.checker.check_model(model)
        path = args.out / f"{name}.onnx"
        onnx.save(model, path)
        print(
            f"wrote {path} ({len(model.graph.node)} nodes, {path.stat().st_size / 1e6:.1f} MB)",
            file=sys.stderr,
        )
    return 0
