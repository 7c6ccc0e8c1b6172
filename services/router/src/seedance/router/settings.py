"""The router's settings (``SEEDANCE_ROUTER_*``) and their translation into gateway settings.

Owns: the environment-facing settings struct and the parsing of its list-valued strings
(replicas, models, layouts, regions) into the gateway's typed `GatewaySettings`. Must not start
anything; `main()` loads the struct, `RouterService` consumes it.

List values are comma-separated strings rather than JSON so that a manifest can write them by
hand: ``SEEDANCE_ROUTER_REPLICAS="triton-0=10.0.0.5:8001,triton-1=10.0.0.6:8001"``.
"""

from __future__ import annotations

import msgspec

from seedance.events.tokens import check_token
from seedance.router.core.planning.planner import PlannerConfig, ReplicaCapacity
from seedance.router.gateway import GatewaySettings, LayoutConversion, ModelRoute

__all__ = [
    "RouterSettings",
    "engine_model_names",
    "gateway_settings",
    "parse_engine_metrics",
    "parse_engine_model_names",
    "parse_layouts",
    "parse_replicas",
    "planner_config",
    "replica_capacity",
]


class RouterSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: Where the OIP gRPC gateway listens.
    listen_address: str = "0.0.0.0:8001"
    #: Where the KServe v2 REST front listens (empty: no REST).
    rest_address: str = "0.0.0.0:8000"
    #: ``name=host:port,...``: the fallback replicas, used while no replica is registered
    #: (ready) in the ``seedance-router-replicas`` bucket. Replica names are metric labels, so
    #: keep them few and stable.
    replicas: str = ""
    #: Watch the ``seedance-router-replicas`` bucket (keys ``<fleet>.<model>.<replica>``):
    #: registered replicas join and leave without a restart.
    discover_replicas: bool = True
    #: Comma-separated model names (the metric label set; others count as ``other``).
    models: str = ""
    #: ``model/tensor=CLIENT:BACKEND,...`` for inputs, e.g. ``resnet/image=NHWC:NCHW``.
    input_layouts: str = ""
    #: The same for outputs: converted BACKEND -> CLIENT on the way back.
    output_layouts: str = ""
    #: Comma-separated client regions (closed label set) and the header that carries them.
    regions: str = ""
    region_header: str = "x-seedance-region"
    #: The header naming the tenant whose model a request is for (that tenant's registered
    #: replicas only); without it, the shared pool's (docs/router-gateway.md).
    tenant_header: str = "x-seedance-tenant"
    #: Router fleet: gateways of one fleet share weights (KV keys ``<fleet>.<model>``) and model
    #: versions (object names ``<fleet>/...``).
    fleet: str = "default"
    #: This gateway computes forecasts and publishes weights; others only watch the bucket.
    forecast: bool = True
    forecast_interval_s: float = 1.0
    #: A forecast older than this is stale: the selector falls back to least-outstanding.
    stale_after_s: float = 5.0
    #: Window of each published ReplicaStats.
    stats_window_s: float = 10.0
    #: Arrivals kept in memory for retraining (the newest win).
    history_max_s: float = 6 * 3600.0
    #: Decisions waiting to be published; beyond this they are dropped (and counted).
    decision_queue_size: int = 10_000
    decision_flush_s: float = 0.1
    max_attempts: int = 3
    default_timeout_s: float = 60.0
    http_port: int = 9402
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: Replica planner (docs/router.md): recommend each model's replica count every interval
    #: (`ReplicaRecommendation` on ``seedance.routing.<model>.replicas``).
    plan: bool = True
    plan_interval_s: float = 15.0
    plan_ttft_slo_s: float = 2.0
    plan_slo_target: float = 0.95
    #: From asking for a replica to its first request: weights load plus engine start.
    plan_startup_s: float = 60.0
    plan_min_replicas: int = 1
    plan_max_replicas: int = 64
    #: One replica's capacity (the engine profile; defaults: Llama-3.1-70B FP8 on one H200,
    #: docs/router-sim.md).
    plan_prefill_tokens_per_s: float = 7000.0
    plan_prefill_overhead_s: float = 0.02
    plan_decode_step_s: float = 0.028
    plan_kv_capacity_tokens: int = 180_000
    #: Prompt tokens per request, until the gateway reads them from requests (OIP tensors do not
    #: say).
    plan_prompt_tokens: int = 1024
    #: The gateway routes only to the first `replicas` members of its replica set that the plan
    #: recommends (the largest over its models) and drains the others.
    follow_plan: bool = False
    #: This gateway's name in the planner reports it publishes (empty: the host name, the
    #: pod's on Kubernetes). Unique within the fleet.
    instance: str = ""
    #: ``name=url,...``: each replica's Prometheus endpoint whose queue gauges the planner's
    #: backlog rule reads (Triton's ``http://host:8002/metrics``, vLLM's ``/metrics``).
    engine_metrics: str = ""
    #: For replicas not named there: ``http://<replica host>:<port>/metrics`` (Triton: 8002;
    #: vLLM serves it on its HTTP port). 0 and no URL: that replica's queue is not read.
    engine_metrics_port: int = 0
    engine_metrics_timeout_s: float = 1.0
    #: ``router_model=engine_model,...``: the name the engine labels a model's queue gauge with
    #: where it is not the router's (vLLM's ``model_name`` is its served model name, often a
    #: Hugging Face path; Triton's ``model`` its repository's name). Unnamed models: the same.
    engine_model_names: str = ""

    def __post_init__(self) -> None:
        if self.stale_after_s <= 0 or self.forecast_interval_s <= 0:
            raise ValueError("stale_after_s and forecast_interval_s must be > 0")
        if self.plan_interval_s <= 0:
            raise ValueError(f"plan_interval_s must be > 0, got {self.plan_interval_s}")
        if self.plan_prompt_tokens < 0:
            raise ValueError(f"plan_prompt_tokens must be >= 0, got {self.plan_prompt_tokens}")
        # Validated where they live, at start-up rather than at the first tick.
        planner_config(self)
        replica_capacity(self)
        parse_engine_metrics(self.engine_metrics)
        engine_model_names(self)
        if not 0 <= self.engine_metrics_port <= 65535 or self.engine_metrics_timeout_s <= 0:
            raise ValueError(
                "need 0 <= engine_metrics_port <= 65535 and engine_metrics_timeout_s > 0, got "
                f"{self.engine_metrics_port} and {self.engine_metrics_timeout_s}"
            )
        if self.decision_queue_size < 1:
            raise ValueError("decision_queue_size must be >= 1")
        # The fleet is a KV key token and an object-name prefix.
        check_token("fleet", self.fleet)
        if self.rest_address and ":" not in self.rest_address:
            raise ValueError(f"rest_address={self.rest_address!r} is not host:port")


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_replicas(text: str) -> dict[str, str]:
    """``a=host:port,b=host:port`` -> ``{"a": "host:port", ...}``; refuses duplicates."""
    replicas: dict[str, str] = {}
    for item in _items(text):
        name, sep, address = item.partition("=")
        if not sep or not name.strip() or ":" not in address:
            raise ValueError(f"replica {item!r} is not name=host:port")
        if name.strip() in replicas:
            raise ValueError(f"replica {name.strip()!r} given twice")
        replicas[name.strip()] = address.strip()
    return replicas


def parse_engine_metrics(text: str) -> dict[str, str]:
    """``a=http://host:8002/metrics,...`` -> ``{"a": "http://host:8002/metrics", ...}``."""
    urls: dict[str, str] = {}
    for item in _items(text):
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"engine metrics {item!r} is not name=http(s)://host:port/path")
        if name in urls:
            raise ValueError(f"engine metrics for replica {name!r} given twice")
        urls[name] = url
    return urls


def parse_engine_model_names(text: str) -> dict[str, str]:
    """``llama=meta-llama/Llama-3.1-70B-Instruct,...`` -> router model -> engine model."""
    names: dict[str, str] = {}
    for item in _items(text):
        model, sep, engine = item.partition("=")
        model, engine = model.strip(), engine.strip()
        if not sep or not model or not engine:
            raise ValueError(
                f"SEEDANCE_ROUTER_ENGINE_MODEL_NAMES entry {item!r} is not "
                "router_model=engine_model"
            )
        if model in names:
            raise ValueError(
                f"SEEDANCE_ROUTER_ENGINE_MODEL_NAMES entry {item!r}: model {model!r} given twice"
            )
        names[model] = engine
    return names


def engine_model_names(settings: RouterSettings) -> dict[str, str]:
    """Each routed model's name in its engine's queue gauges (router model -> engine model),
    for the models renamed in `engine_model_names`. Refuses an entry for a model the router
    does not route, and two models that would read one engine model's queue."""
    names = parse_engine_model_names(settings.engine_model_names)
    models = _items(settings.models)
    for model, engine in names.items():
        if model not in models:
            raise ValueError(
                f"SEEDANCE_ROUTER_ENGINE_MODEL_NAMES entry {model}={engine}: {model!r} is not "
                f"in SEEDANCE_ROUTER_MODELS ({settings.models!r})"
            )
    reads: dict[str, str] = {}
    for model in models:
        engine = names.get(model, model)
        if engine in reads:
            raise ValueError(
                f"SEEDANCE_ROUTER_ENGINE_MODEL_NAMES: models {reads[engine]!r} and {model!r} "
                f"would both read engine model {engine!r}'s queue"
            )
        reads[engine] = model
    return names


def parse_layouts(text: str) -> dict[str, tuple[LayoutConversion, ...]]:
    """``model/tensor=CLIENT:BACKEND,...`` -> per model, its conversions."""
    out: dict[str, list[LayoutConversion]] = {}
    for item in _items(text):
        target, sep, layouts = item.partition("=")
        model, slash, tensor = target.partition("/")
        client, colon, backend = layouts.partition(":")
        if not (sep and slash and colon and model and tensor and client and backend):
            raise ValueError(f"layout {item!r} is not model/tensor=CLIENT:BACKEND")
        out.setdefault(model.strip(), []).append(
            LayoutConversion(
                tensor=tensor.strip(),
                client_layout=client.strip().upper(),
                backend_layout=backend.strip().upper(),
            )
        )
    return {model: tuple(conversions) for model, conversions in out.items()}


def gateway_settings(settings: RouterSettings) -> GatewaySettings:
    inputs = parse_layouts(settings.input_layouts)
    outputs = parse_layouts(settings.output_layouts)
    models = _items(settings.models)
    unknown = (set(inputs) | set(outputs)) - set(models)
    if unknown:
        raise ValueError(f"layouts name models not in SEEDANCE_ROUTER_MODELS: {sorted(unknown)}")
    return GatewaySettings(
        replicas=parse_replicas(settings.replicas),
        listen_address=settings.listen_address,
        models=tuple(
            ModelRoute(name=m, input_layouts=inputs.get(m, ()), output_layouts=outputs.get(m, ()))
            for m in models
        ),
        regions=tuple(_items(settings.regions)),
        region_header=settings.region_header,
        tenant_header=settings.tenant_header,
        max_attempts=settings.max_attempts,
        default_timeout_s=settings.default_timeout_s,
    )


def planner_config(settings: RouterSettings) -> PlannerConfig:
    return PlannerConfig(
        ttft_slo_s=settings.plan_ttft_slo_s,
        slo_target=settings.plan_slo_target,
        startup_s=settings.plan_startup_s,
        interval_s=settings.plan_interval_s,
        min_replicas=settings.plan_min_replicas,
        max_replicas=settings.plan_max_replicas,
    )


def replica_capacity(settings: RouterSettings) -> ReplicaCapacity:
    return ReplicaCapacity(
        prefill_tokens_per_s=settings.plan_prefill_tokens_per_s,
        prefill_overhead_s=settings.plan_prefill_overhead_s,
        decode_step_s=settings.plan_decode_step_s,
        kv_capacity_tokens=settings.plan_kv_capacity_tokens,
    )
