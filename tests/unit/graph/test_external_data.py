"""External data is read only from inside the model's own directory, and a location leading out
gets one answer whether or not something is there (so it cannot be used to probe the host).

The strongest check traces a real compile's system calls: nothing outside the directory is
opened, stat'ed or read as a link.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest

from seedance.graph_compiler import (
    ORT_CPU,
    InvalidModel,
    Precision,
    PrecisionPolicy,
    check_compatibility,
    compile_model,
)
from tests.unit.graph.gc_onnx_kit import external_data_model

FP32 = PrecisionPolicy(priority_order=(Precision.FP32,))
W = np.arange(16, dtype=np.float32).reshape(4, 4) / 16


def _model(location: str) -> onnx.ModelProto:
    return external_data_model(location, W)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``model/`` (the model's directory) and, next to it, ``outside/`` with a secret in it."""
    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(W.tobytes() * 4)
    return model_dir, outside


def _write(model_dir: Path, location: str) -> Path:
    path = model_dir / f"m-{uuid.uuid4().hex[:8]}.onnx"
    onnx.save(_model(location), path)
    return path


def _outside_locations(model_dir: Path, outside: Path) -> list[tuple[str, str]]:
    """Pairs leading out of ``model_dir``: (to a file that exists, to one that does not)."""
    (model_dir / "to_secret").symlink_to("../outside/secret.bin")
    (model_dir / "to_nothing").symlink_to("../outside/nothing.bin")
    (model_dir / "abs_secret").symlink_to(outside / "secret.bin")
    (model_dir / "abs_nothing").symlink_to(outside / "nothing.bin")
    (model_dir / "sub").mkdir()
    (model_dir / "sub" / "up").symlink_to("../../outside")  # a directory link out, then a file
    return [
        (str(outside / "secret.bin"), str(outside / "nothing.bin")),
        ("../outside/secret.bin", "../outside/nothing.bin"),
        ("./../outside/secret.bin", "./../outside/nothing.bin"),
        ("to_secret", "to_nothing"),
        ("abs_secret", "abs_nothing"),
        ("sub/up/secret.bin", "sub/up/nothing.bin"),
    ]


def _refusal(path: Path, location: str) -> tuple[str, str]:
    with pytest.raises(InvalidModel) as err:
        compile_model(path, FP32)
    compat = check_compatibility(path, ORT_CPU)
    assert [p.kind for p in compat.problems] == ["external_data"]
    texts = (str(err.value), compat.problems[0].message)
    return texts[0].replace(repr(location), "<loc>"), texts[1].replace(repr(location), "<loc>")


def test_a_location_leading_out_gets_one_answer(layout: tuple[Path, Path]) -> None:
    model_dir, outside = layout
    for present, missing in _outside_locations(model_dir, outside):
        a = _refusal(_write(model_dir, present), present)
        b = _refusal(_write(model_dir, missing), missing)
        assert a == b, (present, missing)
        assert a[0] == "tensor 'W': external data location <loc> is outside the model's directory"


def test_a_symlink_loop_is_refused_like_the_rest(layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    (model_dir / "loop").symlink_to("loop")
    with pytest.raises(InvalidModel, match="'loop' is outside the model's directory"):
        compile_model(_write(model_dir, "loop"), FP32)


def test_data_inside_the_directory_is_read_through_inner_links(layout: tuple[Path, Path]):
    model_dir, _ = layout
    (model_dir / "weights").mkdir()
    (model_dir / "weights" / "w.bin").write_bytes(W.tobytes())
    (model_dir / "w.bin").symlink_to("weights/./w.bin")
    (model_dir / "here").symlink_to(".")
    for location in ("weights/w.bin", "w.bin", "here/./weights/w.bin"):
        path = _write(model_dir, location)
        assert check_compatibility(path, ORT_CPU).ok
        result = compile_model(path, FP32)
        (init,) = onnx.load_from_string(result.model_bytes).graph.initializer
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), W)
    # Missing inside the directory is said as such: the tenant learns nothing about the host.
    compat = check_compatibility(_write(model_dir, "weights/gone.bin"), ORT_CPU)
    assert [p.message for p in compat.problems] == [
        "initializer 'W' points at missing file 'weights/gone.bin'"
    ]


def test_a_model_without_a_directory_reads_no_external_data() -> None:
    with pytest.raises(InvalidModel, match="has no directory to read it from"):
        compile_model(_model("w.bin").SerializeToString(), FP32)
    # From the text alone, with nothing looked at: a proto in memory has no directory either.
    compat = check_compatibility(_model("/etc/passwd"), ORT_CPU)
    assert [p.message for p in compat.problems] == [
        "tensor 'W': external data location '/etc/passwd' is outside the model's directory"
    ]


_TRACED = """
import sys
from pathlib import Path
from seedance.graph_compiler import ORT_CPU, InvalidModel, PrecisionPolicy, Precision
from seedance.graph_compiler import check_compatibility, compile_model
for p in sys.argv[1:]:
    check_compatibility(p, ORT_CPU)
    try:
        compile_model(Path(p), PrecisionPolicy(priority_order=(Precision.FP32,)))
    except InvalidModel:
        pass
    else:
        raise SystemExit(f"{p} compiled")
"""


def test_nothing_outside_the_directory_is_touched(layout: tuple[Path, Path]) -> None:
    # strace is a system dependency of `make test` (mk/graph.mk), not an optional one.
    assert shutil.which("strace"), "strace is missing: `make system-deps` installs it"
    model_dir, outside = layout
    paths = [
        _write(model_dir, location)
        for pair in _outside_locations(model_dir, outside)
        for location in pair
    ]
    log = model_dir.parent / "strace.log"
    subprocess.run(
        [
            *("strace", "-f", "-qq", "-s", "4096", "-e", "trace=%file", "-o", str(log)),
            *(sys.executable, "-c", _TRACED, *map(str, paths)),
        ],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    traced = log.read_text()
    assert str(paths[0]) in traced  # the trace did see the compile's own files
    # The path a call acts on is its first string argument (readlink's second is its answer).
    touched = re.findall(r'^\d+\s+\w+\((?:AT_FDCWD, |\d+<[^>]*>, |\d+, )?"([^"]*)"', traced, re.M)
    named = {"outside", "secret.bin", "nothing.bin"}
    leaked = [p for p in touched if named & set(Path(p).parts)]
    assert leaked == []
