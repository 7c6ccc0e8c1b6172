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
from concurrent.futures import ProcessPoolExecutor

__all__ = ["kill_pool", "limit_memory", "new_pool"]

_MIB = 1024 * 1024


def limit_memory(memory_mib: float) -> None:
    """This process's address space capped at ``memory_mib`` (0: unlimited, as a GPU worker
    needs: CUDA reserves far more address space than it uses)."""
    if memory_mib > 0:
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
