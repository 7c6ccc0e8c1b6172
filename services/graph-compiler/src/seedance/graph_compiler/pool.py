"""The compile pool: the one child process compiles run in, and the bound on its memory.

Owns starting the child (spawn, not fork: forking a process with an event loop and nats threads
is unsafe), limiting its address space (``RLIMIT_AS``, set in the child before it takes any
compile, so an allocation past it fails there as ``MemoryError`` or ORT's allocation error and
is answered as ``CompileOutOfMemory``; the measurement children it spawns inherit the limit),
and killing it (a running task cannot be cancelled in a pool). Must not decide what runs in it
(``worker`` does) nor when to replace it (the service does, on a timeout or a dead child).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from seedance.core.logs import get_logger
from seedance.graph_compiler.core.profile import CUDA_EP

__all__ = ["kill_pool", "limit_memory", "new_pool"]

_MIB = 1024 * 1024

log = get_logger(__name__)


def limit_memory(memory_mib: float, providers: Sequence[str] | None = None) -> None:
    """This process's address space capped at ``memory_mib`` (0: unlimited). Never where
    onnxruntime offers CUDA (``providers``: this process's, by default): CUDA reserves far more
    address space than it uses, so a capped GPU worker could not run a model on its GPU at all;
    there the cap is left off and said (the pod's memory limit bounds it)."""
    if memory_mib <= 0:
        return
    if providers is None:
        from seedance.graph_compiler.measuring import available_providers

        providers = available_providers()
    if CUDA_EP in providers:
        log.warning("compile_memory_limit_off_for_cuda", compile_memory_mib=memory_mib)
        return
    limit = int(memory_mib * _MIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def new_pool(memory_mib: float) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=limit_memory,
        initargs=(memory_mib,),
    )


def kill_pool(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        with contextlib.suppress(Exception):
            p.kill()
