"""Fixtures for the graph compiler's tests: small ONNX models built in-process (no files)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import helper

# Tests run with --import-mode=importlib, so the helper module next to this file is put on the
# path explicitly (its name is unique to this area).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gc_onnx_kit import f32, init, make_model, overflow_ln_model


@pytest.fixture(scope="session")
def make_models() -> ModuleType:
    """seedance.bench.models, so tests build the same (scaled-down) BERT/ResNet as the bench."""
    from seedance.bench import models

    return models


@pytest.fixture(scope="session")
def tiny_bert(make_models) -> onnx.ModelProto:
    return make_models.build_bert(layers=2, hidden=64, heads=4, ffn=128, vocab=100, seq=16)


@pytest.fixture(scope="session")
def small_cnn() -> onnx.ModelProto:
    """Conv+BN+Relu ×2 with a residual Add, pooling and a classifier Gemm: a CNN in miniature."""
    rng = np.random.default_rng(0)

    def conv_bn(x: str, c_in: int, c_out: int, tag: str) -> tuple[list, list, str]:
        w = (rng.standard_normal((c_out, c_in, 3, 3)) * np.sqrt(2 / (9 * c_in))).astype(np.float32)
        inits = [
            init(f"{tag}_w", w),
            init(f"{tag}_g", rng.uniform(0.5, 1.5, c_out).astype(np.float32)),
            init(f"{tag}_b", (rng.standard_normal(c_out) * 0.1).astype(np.float32)),
            init(f"{tag}_m", (rng.standard_normal(c_out) * 0.1).astype(np.float32)),
            init(f"{tag}_v", rng.uniform(0.5, 1.5, c_out).astype(np.float32)),
        ]
        nodes = [
            helper.make_node(
                "Conv", [x, f"{tag}_w"], [f"{tag}_c"], name=f"{tag}_conv", pads=[1, 1, 1, 1]
            ),
            helper.make_node(
                "BatchNormalization",
                [f"{tag}_c", f"{tag}_g", f"{tag}_b", f"{tag}_m", f"{tag}_v"],
                [f"{tag}_bn"],
                name=f"{tag}_bn",
            ),
            helper.make_node("Relu", [f"{tag}_bn"], [f"{tag}_r"], name=f"{tag}_relu"),
        ]
        return nodes, inits, f"{tag}_r"

    n1, i1, x1 = conv_bn("input", 3, 16, "c1")
    n2, i2, x2 = conv_bn(x1, 16, 16, "c2")
    tail = [
        helper.make_node("Add", [x1, x2], ["res"], name="res_add"),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    fc = [
        init("fc_w", (rng.standard_normal((10, 16)) * 0.3).astype(np.float32)),
        init("fc_b", np.zeros(10, np.float32)),
    ]
    return make_model(
        n1 + n2 + tail, [f32("input", [1, 3, 16, 16])], [f32("logits", [1, 10])], i1 + i2 + fc
    )


@pytest.fixture(scope="session")
def overflow_ln() -> onnx.ModelProto:
    return overflow_ln_model()  # see gc_onnx_kit: the integration tests compile it too
