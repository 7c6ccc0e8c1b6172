"""Cross-check the FP16 emulation against real FP16 arithmetic (torch ``.half()`` on a GPU).

Three steps, one file:
  prepare DIR  (here, needs onnx/onnxruntime): builds a small graph whose decomposed LayerNorm
               overflows in FP16 on large inputs, runs the emulator under the all-FP16 plan and
               under the fallback plan the compiler chooses, and writes DIR/graph.json +
               DIR/bundle.npz (weights, inputs, every tensor of every run).
  gpu DIR OUT  (on the GPU machine, needs only torch + numpy): interprets the same graph in
               torch on CUDA with every FP16 node in ``.half()`` and FP32 nodes in float32,
               compares each tensor with the emulation, writes OUT/xcheck.json.
  report JSON  (here): prints the comparison as a markdown table for docs/graph-compiler.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

PLANS = ("fp32", "fp16_all", "fp16_fallback")


def prepare(out_dir: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from seedance.graph_compiler.core import fp16
    from seedance.graph_compiler.sessions import OrtSessions

    rng = np.random.default_rng(0)
    d, h, o = 512, 256, 64
    inits = {
        "g": rng.uniform(0.5, 1.5, d).astype(np.float32),
        "b": (rng.standard_normal(d) * 0.1).astype(np.float32),
        "eps": np.array(1e-5, np.float32),
        "two": np.array(2.0, np.float32),
        "W1": (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32),
        "B1": (rng.standard_normal(h) * 0.1).astype(np.float32),
        "sqrt2": np.array(np.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
        "W2": (rng.standard_normal((h, o)) / np.sqrt(h)).astype(np.float32),
    }
    spec = [
        ("mean", "ReduceMean", ["x"], {"axes": [-1], "keepdims": 1}),
        ("xc", "Sub", ["x", "mean"], {}),
        ("sq", "Pow", ["xc", "two"], {}),
        ("var", "ReduceMean", ["sq"], {"axes": [-1], "keepdims": 1}),
        ("ve", "Add", ["var", "eps"], {}),
        ("sd", "Sqrt", ["ve"], {}),
        ("xn", "Div", ["xc", "sd"], {}),
        ("xg", "Mul", ["xn", "g"], {}),
        ("ln", "Add", ["xg", "b"], {}),
        ("h1", "MatMul", ["ln", "W1"], {}),
        ("h1b", "Add", ["h1", "B1"], {}),
        ("hs", "Div", ["h1b", "sqrt2"], {}),
        ("he", "Erf", ["hs"], {}),
        ("he1", "Add", ["he", "one"], {}),
        ("hm", "Mul", ["h1b", "he1"], {}),
        ("gelu", "Mul", ["hm", "half"], {}),
        ("logits", "MatMul", ["gelu", "W2"], {}),
        ("y", "Softmax", ["logits"], {"axis": -1}),
    ]
    nodes = [helper.make_node(op, ins, [out], name=out, **attrs) for out, op, ins, attrs in spec]
    graph = helper.make_graph(
        nodes,
        "ln_overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, o])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    # opset 17: ReduceMean still takes axes as an attribute.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    x_small = rng.standard_normal((4, d)).astype(np.float32)
    x_large = (rng.standard_normal((4, d)) * 1000.0 + 3.0).astype(np.float32)  # var ≈ 1e6
    em = fp16.Fp16Emulator(model, OrtSessions())
    arrays: dict[str, np.ndarray] = {f"init/{k}": v for k, v in inits.items()}
    plans = {}
    refs = {}
    for sample, x in (("small", x_small), ("large", x_large)):
        arrays[f"input/{sample}"] = x
        refs[sample] = em.run({"x": x}, None)
    dtypes = em.dtypes(refs["small"])
    plans["fp32"] = {n.name: "fp32" for n in model.graph.node}
    plans["fp16_all"] = fp16.fp16_plan(model, dtypes, {})
    # The compiler's first fallback rule: nodes whose FP32 magnitudes leave the FP16 range.
    emus = [em.run({"x": x}, plans["fp16_all"]) for x in (x_small, x_large)]
    found = em.findings([refs["small"], refs["large"]], emus)
    block = {f.node: "overflow" for f in found if f.ref_max_abs > fp16.FP16_MAX}
    plans["fp16_fallback"] = fp16.fp16_plan(model, dtypes, block)
    for plan_name, plan in plans.items():
        for sample, x in (("small", x_small), ("large", x_large)):
            env = em.run({"x": x}, None if plan_name == "fp32" else plan)
            for out, *_ in spec:
                arrays[f"emu/{plan_name}/{sample}/{out}"] = env[out]
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_dir / "bundle.npz", **arrays)
    (out_dir / "graph.json").write_text(
        json.dumps(
            {
                "nodes": [
                    {"out": out, "op": op, "inputs": ins, "attrs": attrs}
                    for out, op, ins, attrs in spec
                ],
                "plans": {
                    k: {n: (v is None) for n, v in p.items()}
                    if k != "fp32"
                    else dict.fromkeys(p, False)
                    for k, p in plans.items()
                },
                "blocked": sorted(block),
            },
            indent=1,
        )
    )
    print(f"wrote {out_dir}/graph.json and bundle.npz; blocked by fallback: {sorted(block)}")


def gpu(bundle_dir: Path, out_dir: Path) -> None:
    import torch

    spec = json.loads((bundle_dir / "graph.json").read_text())
    z = np.load(bundle_dir / "bundle.npz")
    dev = torch.device("cuda")
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "allow_fp16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "runs": {},
    }

    def op(node, args):
        kind, a = node["op"], node["attrs"]
        if kind == "ReduceMean":
            return args[0].mean(dim=a["axes"][0], keepdim=bool(a["keepdims"]))
        if kind == "Softmax":
            return torch.softmax(args[0], dim=a["axis"])
        fns = {
            "Sub": torch.sub,
            "Add": torch.add,
            "Mul": torch.mul,
            "Div": torch.div,
            "Pow": torch.pow,
            "Sqrt": torch.sqrt,
            "Erf": torch.erf,
            "MatMul": torch.matmul,
        }
        return fns[kind](*args)

    for plan_name, plan in spec["plans"].items():
        for sample in ("small", "large"):
            env = {
                k.split("/", 1)[1]: torch.from_numpy(z[k]).to(dev)
                for k in z.files
                if k.startswith("init/")
            }
            env["x"] = torch.from_numpy(z[f"input/{sample}"]).to(dev)
            stats = {}
            for node in spec["nodes"]:
                half = plan[node["out"]]
                dtype = torch.float16 if half else torch.float32
                y = op(node, [env[i].to(dtype) for i in node["inputs"]])
                env[node["out"]] = y
                got = y.float().cpu().numpy()
                emu = z[f"emu/{plan_name}/{sample}/{node['out']}"]
                ref = z[f"emu/fp32/{sample}/{node['out']}"]
                fin = np.isfinite(got) & np.isfinite(emu)
                scale = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0)) or 1.0
                stats[node["out"]] = {
                    "half": half,
                    "gpu_nonfinite": int((~np.isfinite(got)).sum()),
                    "emu_nonfinite": int((~np.isfinite(emu)).sum()),
                    "nonfinite_positions_agree": bool(
                        np.array_equal(~np.isfinite(got), ~np.isfinite(emu))
                    ),
                    "max_abs_diff_gpu_vs_emu": float(
                        np.max(np.abs(got[fin] - emu[fin]), initial=0)
                    ),
                    "max_abs_diff_gpu_vs_fp32": float(
                        np.max(np.abs(got[np.isfinite(got)] - ref[np.isfinite(got)]), initial=0)
                    ),
                    "ref_scale": scale,
                }
            result["runs"][f"{plan_name}/{sample}"] = stats
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "xcheck.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v["y"] for k, v in result["runs"].items()}, indent=1))


def report(path: Path) -> None:
    r = json.loads(path.read_text())
    print(
        f"device: {r['device']}, torch {r['torch']}, reduced-precision fp16 matmul reduction "
        f"{r['allow_fp16_reduced_precision_reduction']}\n"
    )
    print(
        "| plan / sample | FP16 nodes | first non-finite tensor (GPU) | same in emulation | "
        "non-finite positions agree (all tensors) | output y: max abs GPU−emu | "
        "output y: max abs GPU−FP32 |"
    )
    print("|---|---|---|---|---|---|---|")
    for run, stats in r["runs"].items():
        first_gpu = next((k for k, s in stats.items() if s["gpu_nonfinite"]), "none")
        first_emu = next((k for k, s in stats.items() if s["emu_nonfinite"]), "none")
        agree = all(s["nonfinite_positions_agree"] for s in stats.values())
        n16 = sum(s["half"] for s in stats.values())
        y = stats["y"]
        print(
            f"| {run} | {n16}/{len(stats)} | {first_gpu} | {first_emu} | {agree} | "
            f"{y['max_abs_diff_gpu_vs_emu']:.3g} | {y['max_abs_diff_gpu_vs_fp32']:.3g} |"
        )
    worst = max(
        (
            (run, k, s["max_abs_diff_gpu_vs_emu"] / s["ref_scale"])
            for run, st in r["runs"].items()
            for k, s in st.items()
        ),
        key=lambda t: t[2],
    )
    print(
        f"\nlargest GPU−emulation difference relative to the tensor's FP32 scale: "
        f"{worst[2]:.3g} ({worst[0]}, tensor {worst[1]})"
    )


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "prepare":
        prepare(Path(sys.argv[2]))
    elif cmd == "gpu":
        gpu(Path(sys.argv[2]), Path(sys.argv[3]))
    elif cmd == "report":
        report(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
