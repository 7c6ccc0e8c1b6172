"""The collector's settings (``SEEDANCE_TELEMETRY_COLLECTOR_*``), checked when they are loaded.

Owns the settings object and its value checks (each error names the variable and the value).
It must not read files or NVML: whether a path exists is checked by ``__main__`` at start.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from seedance.events.tokens import InvalidToken, check_token, kube_node_token

__all__ = ["ENV_PREFIX", "CollectorSettings"]

ENV_PREFIX = "SEEDANCE_TELEMETRY_COLLECTOR_"


class CollectorSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: ``replay`` (a simulated fleet from a node list) or ``nvml`` (this node's GPUs).
    source: Literal["replay", "nvml"] = "replay"
    #: Node list in the Alibaba trace's format (``sn,cpu_milli,memory_mib,gpu,model``), replay.
    node_csv: str = ""
    #: Replay only the first N GPU nodes (0: all).
    max_nodes: int = 0
    #: Seconds between samples (one event per node per tick).
    tick_s: float = 1.0
    #: Seconds between the slow NVML reads (temperature, clocks, processes, XID); nvml only.
    slow_interval_s: float = 10.0
    #: Seconds between the reads that cost milliseconds each (energy, ECC, GPM), made on the
    #: first slow read this long after the last (dcgm-exporter collects every 30 s); nvml only.
    costly_interval_s: float = 30.0
    #: Seconds between NVML power reads, made on the first tick at or after each (NVML's power
    #: draw is a 1 s average on Ampere and newer except GA100, so a faster read mostly re-reads
    #: the same second); nvml.
    power_interval_s: float = 1.0
    #: This node's name (nvml): its Kubernetes name, dots and all (``spec.nodeName``), written
    #: with ``:`` for ``.`` in subjects and events, as the bridge and the node agent write it
    #: (its user ``node-<name>`` speaks for those subjects); the host name when empty.
    node_name: str = ""
    #: The pool this node's inventory names (nvml; a replayed fleet is in ``default``).
    pool: str = "default"
    #: ``/metrics``, ``/healthz``, ``/readyz`` (dcgm-exporter's own port is 9400); 0: any free.
    http_port: int = 9400
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: TEST / DEMO AID: serve NVML from a recording (``seedance-nvml-recording/1`` JSON) instead
    #: of the hardware; the GPUs, their values and their errors are the recording's.
    nvml_recording: str = ""
    #: Republish the inventory this often (s): the telemetry stream keeps messages for an hour,
    #: so a slicer started later still finds every node.
    inventory_interval_s: float = 900.0
    #: Non-empty: this collector's durable is ``collector-placements-<instance>``. Every
    #: replayed fleet needs every placement, so collectors that replay side by side (tests, two
    #: demos on one server) must not share a durable.
    #: Development only: the generated NATS permissions grant the catalogue's names alone (run
    #: it as an operator or on a server without the shipped users).
    instance: str = ""

    def __post_init__(self) -> None:
        names = ("slow_interval_s", "costly_interval_s", "power_interval_s", "inventory_interval_s")
        for name in ("tick_s", *names):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be > 0, got {value!r}")
        if self.max_nodes < 0:
            raise ValueError(f"{ENV_PREFIX}MAX_NODES must be >= 0, got {self.max_nodes!r}")
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"{ENV_PREFIX}HTTP_PORT must be within 0..65535, got {self.http_port}")
        if self.source == "replay" and not self.node_csv:
            raise ValueError(f"{ENV_PREFIX}NODE_CSV is required with SOURCE=replay")
        if self.source != "nvml" and self.nvml_recording:
            raise ValueError(f"{ENV_PREFIX}NVML_RECORDING applies only to SOURCE=nvml")
        checks = {"node_name": kube_node_token, "pool": _pool, "instance": _instance}
        for name, check in checks.items():
            value = getattr(self, name)
            if value:
                try:
                    check(value)
                except InvalidToken as exc:
                    raise ValueError(f"{ENV_PREFIX}{name.upper()}: {exc}") from None


def _pool(value: str) -> str:
    return check_token("pool", value)


def _instance(value: str) -> str:
    return check_token("instance", value)
