"""The gateway's settings: the replicas, the models it routes and how, and its bounds.

Owns: `GatewaySettings` (validated on construction) and `ModelRoute` (what the gateway must know
about one model beyond forwarding it). Must not read the environment: the service's settings
(`seedance.router.settings`) parse ``SEEDANCE_ROUTER_*`` and build these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from seedance.router.gateway.tensors import LayoutConversion
from seedance.router.gateway.warmup import WarmupPolicy

__all__ = ["GatewaySettings", "ModelRoute"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRoute:
    """What the gateway must know about one model beyond forwarding it.

    `input_layouts` convert client -> backend before forwarding (e.g. the client sends
    `image` as NHWC, the model's config says NCHW); `output_layouts` convert backend -> client
    on the way back. ModelMetadata answers show the client layout for those tensors.
    """

    name: str
    input_layouts: tuple[LayoutConversion, ...] = ()
    output_layouts: tuple[LayoutConversion, ...] = ()
    # Warm this model on a new replica before it takes traffic.
    warm_up: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    """Everything a gateway needs; built and validated by the service's `main()`."""

    # Replica name (a metric label, so a small closed set) -> "host:port" of its gRPC endpoint.
    replicas: Mapping[str, str]
    listen_address: str = "127.0.0.1:0"
    models: tuple[ModelRoute, ...] = ()
    # Closed set of client regions; the region header's other values count as "other".
    regions: tuple[str, ...] = ()
    region_header: str = "x-seedance-region"
    # Names the tenant whose model a request is for (its replicas only); without it, the
    # operator's shared pool's. A selector, not a credential: see docs/security.md.
    tenant_header: str = "x-seedance-tenant"
    # Attempts per request, first included, each on a different replica.
    max_attempts: int = 3
    # Upstream timeout when the client sets no deadline: a stuck replica must not hold a
    # request (and its outstanding slot) forever.
    default_timeout_s: float = 60.0
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 1.0
    warmup: WarmupPolicy = field(default_factory=WarmupPolicy)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} must be >= 1")
        if self.default_timeout_s <= 0:
            raise ValueError(f"default_timeout_s={self.default_timeout_s} must be > 0")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model names in {names}")
