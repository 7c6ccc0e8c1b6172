"""Serving a compiled artifact the way it was timed: ``load_session`` and the Triton model.

Owns reading the deployment profile from an artifact's metadata and applying it (provider,
optimisation level, IO binding, CUDA-graph capture, NHWC kernels) through ``ProfiledRunner``,
the same runner the measurer timed the artifact with, and writing a Triton model repository
entry (``<name>/1/model.onnx`` and ``<name>/config.pbtxt``) for replicas Triton serves. Must not
choose a profile (the compiler did, by timing) or change the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from seedance.graph_compiler.core.profile import (
    SessionProfile,
    profile_from_model,
    triton_config,
)
from seedance.graph_compiler.measuring import ProfiledRunner

__all__ = ["load_session", "write_triton_model"]


def _load(artifact: bytes | str | Path) -> tuple[bytes, onnx.ModelProto]:
    data = artifact if isinstance(artifact, bytes) else Path(artifact).read_bytes()
    # Only the graph's outer fields are needed; parsing the whole proto once is cheap next to
    # session creation.
    return data, onnx.load_from_string(data)


def load_session(
    artifact: bytes | str | Path, profile: SessionProfile | None = None
) -> ProfiledRunner:
    """A runner for ``artifact`` under its recorded profile (or ``profile``): ``.run(feeds)``
    returns the outputs as numpy arrays, ``.session`` is the ORT session. An artifact without a
    profile (not compiled by Seedance) runs as a plain CPU session at ORT_ENABLE_ALL."""
    data, model = _load(artifact)
    prof = profile or profile_from_model(model) or SessionProfile()
    return ProfiledRunner(data, json.loads(prof.to_json()))


def write_triton_model(artifact: bytes | str | Path, repository: str | Path, name: str) -> Path:
    """Write ``<repository>/<name>/1/model.onnx`` and ``config.pbtxt``; returns the model dir."""
    data, model = _load(artifact)
    prof = profile_from_model(model) or SessionProfile()
    root = Path(repository) / name
    (root / "1").mkdir(parents=True, exist_ok=True)
    (root / "1" / "model.onnx").write_bytes(data)
    (root / "config.pbtxt").write_text(triton_config(name, model, prof))
    return root
