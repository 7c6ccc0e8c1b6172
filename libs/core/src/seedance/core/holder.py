"""The name a process holds a lease under when none is configured (`default_holder`).

Owns only that default. It must not decide who leads: a lease tells processes apart by the
revision each wrote (`seedance.core.kv.Lease`), never by this name; the name is for people
reading logs and the key (which process leads, which one lost).
"""

from __future__ import annotations

import functools
import os
import secrets
import socket

__all__ = ["default_holder"]


@functools.cache
def default_holder() -> str:
    """``<host>-<pid>-<4 hex>``: the host name alone was shared by two processes on one host
    (two replicas on a machine, a restart beside its predecessor), so their logs could not
    tell them apart; the pid tells processes of one host apart, the random suffix a pid
    reused (every container's first process is pid 1 of its own namespace). One per process,
    so its leases' log lines agree."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
