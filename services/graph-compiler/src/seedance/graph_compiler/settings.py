"""The graph compiler's settings (``SEEDANCE_GRAPH_COMPILER_*``)."""

from __future__ import annotations

import msgspec

__all__ = ["GraphCompilerSettings"]


class GraphCompilerSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: Health and metrics endpoint (deploy/compose and deploy/k8s use 9403).
    http_port: int = 9403
    #: Object store for inputs and artifacts (a catalogue entry of `OBJECT_STORES`).
    object_store: str = "seedance-graph-models"
    #: Artifacts up to this size go into the object store; larger ones are written under
    #: ``artifact_dir`` and sent by reference (nats-py's object store moves ~10 MiB/s here).
    max_inline_artifact_mib: float = 64.0
    #: Where artifacts over the inline limit are written ("" refuses them with a named error).
    artifact_dir: str = ""
    #: Local model paths (``model_url`` without a scheme, or ``file://``) must lie under this
    #: directory; "" refuses local paths, so a tenant cannot make the compiler read its files.
    model_dir: str = ""
    #: Scratch space for fetched models and artifacts being written ("": the system temp dir).
    work_dir: str = ""
    #: > 0: the report also carries before/after peak RSS (fresh processes); 0: skipped.
    measure_runs: int = 0
    #: A compile running longer than this is killed and answered with ``CompileTimeout``.
    compile_timeout_s: float = 1800.0
    #: How often a running compile tells the server it is still working (ack_wait is 300 s).
    heartbeat_s: float = 30.0
    #: Largest model fetched by URL.
    max_model_mib: float = 4096.0
    #: Timed runs per candidate and session profile when choosing among accepted candidates.
    select_runs: int = 20
    #: This worker's key in ``seedance-graph-workers`` ("": host name and process id).
    worker_id: str = ""
    #: How often the worker re-announces its capability (the bucket's TTL is 60 s).
    announce_s: float = 20.0
