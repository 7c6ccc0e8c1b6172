"""A real Triton 2.51 server (from nvidia-pytriton) serving the router's test models.

Runs in `.venv-triton` (PyTriton pins numpy<2, the workspace has numpy 2), started by the
integration tests, the warm-up bench and the demos through `seedance.testing.triton`, by path:

    .venv-triton/bin/python libs/testing/src/seedance/testing/triton_server.py \
        --grpc-port 18001 --http-port 18000 --metrics-port 18002

Everything binds 127.0.0.1. It serves until SIGTERM/SIGINT. Readiness is for the caller to
poll over gRPC (server ready and every model ready): PyTriton's own wait after start-up was seen
to hang for minutes on a loaded machine with the server already serving.

Models (the gateway tests rely on these exact names and shapes):
- `echo`: inputs `x_fp32` FP32 [-1], `x_int64` INT64 [-1], `x_bytes` BYTES [-1] (batched);
  outputs the same tensors back as `y_fp32`, `y_int64`, `y_bytes`.
- `nchw_stats`: input `image` FP32 [3, -1, -1] (NCHW, batched); outputs `image_out` (the image
  as received, NCHW) and `channel_mean` FP32 [3]. A client that sends NHWC only gets correct
  means if something converted the layout.
- `slow`: input `delay_ms` INT32 [1]; sleeps that long, returns `slept_ms` INT32 [1]. Used for
  deadline tests.
- `tokens`: decoupled (a stream's model, as an LLM served token by token): inputs `first_ms`,
  `count`, `gap_ms` INT32 [1]; sleeps `first_ms`, answers `token` INT32 [1] = 0, then `count - 1`
  more responses (1, 2, ...) `gap_ms` apart. Requests of one stream sent before another's
  responses are all out interleave (PyTriton steps their generators in turn), so the tests time
  one request at a time.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator

# The bundled triton_python_backend_stub links the shared libpython it finds on the loader path;
# without this it picks the system one (Debian 3.11.2) while the venv's stdlib comes from the
# interpreter running this script, and model load fails (`_thread.RLock` has no attribute
# `_recursion_count`). Must be set before PyTriton starts tritonserver, which the stub inherits.
_LIBDIR = sysconfig.get_config_var("LIBDIR") or ""
os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
    p for p in (_LIBDIR, os.environ.get("LD_LIBRARY_PATH", "")) if p
)

import numpy as np  # noqa: E402
from pytriton.decorators import batch  # noqa: E402
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402


def _echo(x_fp32: np.ndarray, x_int64: np.ndarray, x_bytes: np.ndarray) -> dict[str, np.ndarray]:
    return {"y_fp32": x_fp32, "y_int64": x_int64, "y_bytes": x_bytes}


def _nchw_stats(image: np.ndarray) -> dict[str, np.ndarray]:
    # image is [batch, C, H, W]; the mean per channel reduces H and W.
    means = image.reshape(image.shape[0], image.shape[1], -1).mean(axis=2).astype(np.float32)
    return {"image_out": image, "channel_mean": means}


def _slow(delay_ms: np.ndarray) -> dict[str, np.ndarray]:
    longest_ms = int(delay_ms.max())
    time.sleep(longest_ms / 1000.0)
    return {"slept_ms": np.full_like(delay_ms, longest_ms)}


def _tokens(requests: list[dict[str, np.ndarray]]) -> Iterator[list[dict[str, np.ndarray]]]:
    # Unbatched and one request per call (no batcher): a request's delays are its own.
    (request,) = requests
    time.sleep(int(request["first_ms"][0]) / 1000.0)
    for i in range(int(request["count"][0])):
        if i:
            time.sleep(int(request["gap_ms"][0]) / 1000.0)
        yield [{"token": np.array([i], dtype=np.int32)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument(
        "--workspace",
        required=True,
        help="PyTriton's working copy of the server; under the caller's temporary directory so "
        "that a killed server leaves nothing behind in ~/.cache/pytriton",
    )
    args = parser.parse_args()

    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
        exit_timeout_secs=5,
    )
    batcher = DynamicBatcher(max_queue_delay_microseconds=100)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with Triton(config=config, workspace=args.workspace) as triton:
        triton.bind(
            model_name="echo",
            infer_func=batch(_echo),
            inputs=[
                Tensor(name="x_fp32", dtype=np.float32, shape=(-1,)),
                Tensor(name="x_int64", dtype=np.int64, shape=(-1,)),
                Tensor(name="x_bytes", dtype=np.bytes_, shape=(-1,)),
            ],
            outputs=[
                Tensor(name="y_fp32", dtype=np.float32, shape=(-1,)),
                Tensor(name="y_int64", dtype=np.int64, shape=(-1,)),
                Tensor(name="y_bytes", dtype=np.bytes_, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=64, batcher=batcher),
            strict=True,
        )
        triton.bind(
            model_name="nchw_stats",
            infer_func=batch(_nchw_stats),
            inputs=[Tensor(name="image", dtype=np.float32, shape=(3, -1, -1))],
            outputs=[
                Tensor(name="image_out", dtype=np.float32, shape=(3, -1, -1)),
                Tensor(name="channel_mean", dtype=np.float32, shape=(3,)),
            ],
            config=ModelConfig(max_batch_size=16, batcher=batcher),
            strict=True,
        )
        triton.bind(
            model_name="slow",
            infer_func=batch(_slow),
            inputs=[Tensor(name="delay_ms", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="slept_ms", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=8, batcher=batcher),
            strict=True,
        )
        triton.bind(
            model_name="tokens",
            infer_func=_tokens,
            inputs=[
                Tensor(name="first_ms", dtype=np.int32, shape=(1,)),
                Tensor(name="count", dtype=np.int32, shape=(1,)),
                Tensor(name="gap_ms", dtype=np.int32, shape=(1,)),
            ],
            outputs=[Tensor(name="token", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
            strict=True,
        )
        triton.run()
        stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
