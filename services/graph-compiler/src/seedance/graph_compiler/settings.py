"""The graph compiler's settings (``SEEDANCE_GRAPH_COMPILER_*``).

Owns the one frozen settings object and its validation at start-up (a bad value names the
setting and the value). List values are comma-separated strings, as in the router's settings,
so that a manifest can write them by hand. Must not start or fetch anything.
"""

from __future__ import annotations

import msgspec

from seedance.graph_compiler.fetch import FetchPolicy

__all__ = ["GraphCompilerSettings"]


class GraphCompilerSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: Health and metrics endpoint (deploy/compose and deploy/k8s use 9403).
    http_port: int = 9403
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: Object store for inputs and artifacts (a catalogue entry of `OBJECT_STORES`).
    object_store: str = "seedance-graph-models"
    #: Artifacts up to this size go into the object store; larger ones are written under
    #: ``artifact_dir`` and sent by reference (nats-py's object store moves ~10 MiB/s here).
    max_inline_artifact_mib: float = 64.0
    #: Where artifacts over the inline limit are written ("" refuses them with a named error).
    artifact_dir: str = ""
    #: Local model paths (``model_url`` without a scheme, or ``file://``) must lie under
    #: ``<model_dir>/<tenant>/``, the request subject's tenant; "" refuses local paths, so a
    #: tenant cannot make the compiler read its files.
    model_dir: str = ""
    #: Scratch space for fetched models and artifacts being written ("": the system temp dir).
    work_dir: str = ""
    #: > 0: the report also carries before/after peak RSS (fresh processes); 0: skipped.
    measure_runs: int = 0
    #: A compile running longer than this is killed and answered with ``CompileTimeout``.
    compile_timeout_s: float = 1800.0
    #: Each in-process run of a model (the FP32 reference, the passes' and candidates' checks,
    #: the FP16 emulator's) is stopped after this and the compile answered ``ModelRunTimeout``:
    #: a few hundred bytes (a ``Loop`` of 2^62 trips) would otherwise hold the replica for the
    #: whole ``compile_timeout_s``. BERT-base's slowest reference run here is ~0.4 s
    #: (docs/graph-compiler.md, "Bounds"): 60 s leaves room for larger models on a loaded host.
    run_timeout_s: float = 60.0
    #: All of one compile's runs of the model together: its in-process runs (each run's bound
    #: is the lesser of ``run_timeout_s`` and what is left of this) and its measurement
    #: children; past it the compile is answered ``RunBudgetExhausted``. A 263-byte ``Loop``
    #: at 0.94 s a run under a 2 s bound made ~72 runs; at 25-59 s a run it reached
    #: ``compile_timeout_s``. Honest compiles drew up to 193 s here (BERT-base, CPU target,
    #: 20 timed runs a candidate, a 2-core host at load 8-11; docs/graph-compiler.md, "Bounds").
    compile_run_budget_s: float = 600.0
    #: Most nodes a model may have, its subgraphs' included; more is refused by the
    #: compatibility check (``IncompatibleModel``). Compile time grows with the node count
    #: (docs/graph-compiler.md, "Bounds"); 0: no bound.
    max_nodes: int = 50_000
    #: The compile child's address space (``RLIMIT_AS``), MiB: an allocation past it fails in
    #: the child and the compile is answered ``CompileOutOfMemory`` (a 188-byte
    #: ``ConstantOfShape`` model reached 4,486 MiB). 0: unlimited, which a GPU worker needs
    #: (CUDA reserves far more address space than it uses). Measured need: docs, "Bounds".
    compile_memory_mib: float = 8192.0
    #: How often a running compile tells the server it is still working (ack_wait is 300 s).
    heartbeat_s: float = 30.0
    #: Largest model fetched by URL or copied from ``model_dir``. 2 GiB: protobuf cannot parse
    #: a larger model file, so more would only fill the scratch disk before failing.
    max_model_mib: float = 2048.0
    #: One deadline for a whole URL fetch (resolve, connect, redirects, body).
    fetch_timeout_s: float = 300.0
    #: One deadline for reading a whole chunked upload (``model_chunks``) from SEEDANCE_MODELS:
    #: past it the request is refused (InvalidRequest) and dead-lettered, so that no upload
    #: holds a replica for long. A full 2 GiB upload is ~2k chunks, read in seconds.
    upload_timeout_s: float = 300.0
    #: Schemes a ``model_url`` may use (a subset of ``http,https``; "" refuses every URL).
    #: Plain http is allowed because the required ``model_sha256`` checks what arrived.
    url_schemes: str = "http,https"
    #: Hosts a ``model_url`` may name: exact names, or ``*.example.com`` for any name under it;
    #: "" allows any host whose addresses pass the network check below.
    url_hosts: str = ""
    #: Networks (CIDR) a ``model_url`` may reach although they are not public: loopback,
    #: link-local, private, unspecified, multicast and reserved addresses are refused unless
    #: listed here (e.g. ``10.0.0.0/8`` for an in-cluster model server).
    url_allow_networks: str = ""

    #: Timed runs per candidate and session profile when choosing among accepted candidates.
    select_runs: int = 20
    #: This worker's key in ``seedance-graph-workers`` ("": ``<host>-<pid>-<4 hex>``,
    #: `seedance.core.holder.default_holder`).
    worker_id: str = ""
    #: How often the worker re-announces its capability (the bucket's TTL is 60 s).
    announce_s: float = 20.0

    def __post_init__(self) -> None:
        self.fetch_policy()  # raises ValueError naming the setting and the value
        if not self.upload_timeout_s > 0:
            raise ValueError(f"upload_timeout_s must be > 0, got {self.upload_timeout_s!r}")
        if not self.max_nodes >= 0:
            raise ValueError(f"max_nodes must be >= 0, got {self.max_nodes!r}")
        if not self.compile_memory_mib >= 0:
            raise ValueError(f"compile_memory_mib must be >= 0, got {self.compile_memory_mib!r}")
        if not self.run_timeout_s > 0:
            raise ValueError(f"run_timeout_s must be > 0, got {self.run_timeout_s!r}")
        if not self.compile_run_budget_s > 0:
            raise ValueError(f"compile_run_budget_s must be > 0, got {self.compile_run_budget_s!r}")

    def fetch_policy(self) -> FetchPolicy:
        return FetchPolicy.parse(
            schemes=self.url_schemes,
            hosts=self.url_hosts,
            allow_networks=self.url_allow_networks,
            max_model_mib=self.max_model_mib,
            timeout_s=self.fetch_timeout_s,
        )
