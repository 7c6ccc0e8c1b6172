"""What the code declares, for checking deployment files against it (not against copies).

Services come from the workspace (``services/*/pyproject.toml``), their settings from the one
``msgspec.Struct`` in ``seedance.<pkg>.settings``, their metric names from the metrics classes
and collectors the services build, so a renamed field, port or metric fails the deploy tests.
The NATS users come from ``deploy/auth/users.yaml`` through ``seedance.events.nats_config``, the
functions the generator (``tools/gen/gen_nats_auth.py``) is a thin entry point over.
"""

from __future__ import annotations

import importlib
import inspect
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml

from seedance.events import nats_config

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"


@dataclass(frozen=True)
class ServiceDecl:
    name: str  # telemetry-collector
    package: str  # seedance.telemetry_collector
    distribution: str  # seedance-gpu-telemetry-collector
    scripts: dict[str, str]
    #: The settings Struct, or None while the service has no settings module yet.
    settings: type[msgspec.Struct] | None

    @property
    def env_prefix(self) -> str:
        return "SEEDANCE_" + self.name.upper().replace("-", "_") + "_"

    @property
    def settings_fields(self) -> set[str]:
        return set(self.settings.__struct_fields__) if self.settings else set()


def _settings_struct(package: str) -> type[msgspec.Struct] | None:
    modname = f"{package}.settings"
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name != modname:
            raise  # a broken import inside an existing module is a failure, not "missing"
        return None
    structs = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, msgspec.Struct)
        and obj.__module__ == module.__name__
    ]
    assert len(structs) == 1, f"{modname} should define one settings Struct, has {structs}"
    return structs[0]


def services() -> dict[str, ServiceDecl]:
    out = {}
    for pyproject in sorted((REPO / "services").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name = pyproject.parent.name
        package = "seedance." + name.replace("-", "_")
        out[name] = ServiceDecl(
            name=name,
            package=package,
            distribution=project["name"],
            scripts=dict(project.get("scripts", {})),
            settings=_settings_struct(package),
        )
    return out


#: Services that run only on Kubernetes, and why compose has none of them.
KUBERNETES_ONLY = {
    "k8s-bridge": "it bridges a Kubernetes API server to the bus; compose runs none",
    "node-agent": "it is a kubelet device plugin and reads the kubelet's pod-resources socket",
}


def compose_services() -> dict[str, ServiceDecl]:
    """The workspace's services that compose runs (all but `KUBERNETES_ONLY`)."""
    return {n: d for n, d in services().items() if n not in KUBERNETES_ONLY}


def auth_users() -> dict[str, object]:
    return yaml.safe_load((REPO / nats_config.USERS_FILE).read_text())


def auth_choices() -> nats_config.AuthChoices:
    """The deployment's choices, read as the generator reads them."""
    return nats_config.AuthChoices.from_document(auth_users())


def metric_names() -> set[str]:
    """Every Prometheus series name the services can export (with counter/histogram suffixes)."""
    from prometheus_client import CollectorRegistry

    from seedance.core.metrics import BusMetrics
    from seedance.cost_ledger.service import LedgerMetrics
    from seedance.router.gateway.metrics import GatewayMetrics
    from seedance.slicer.service import SlicerMetrics
    from seedance.telemetry_collector.prometheus import DCGM_GPU_METRICS

    registry = CollectorRegistry()
    for name in services():
        BusMetrics(registry, name)
    LedgerMetrics(registry)
    SlicerMetrics(registry)
    GatewayMetrics(registry, models=(), regions=())
    names: set[str] = set(DCGM_GPU_METRICS)
    for family in registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
    return names
