"""deploy/compose against the compose specification and against the code it runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml

from seedance.bench.images import workspace_version
from seedance.core.auth_callout import XKEY_SEED_VAR, new_issuer
from seedance.core.xkeys import CurveKeyPair, new_curve_keys
from seedance.events import nats_config
from seedance.events.node_permissions import TELEMETRY_REPLAYER
from seedance.events.permissions import CALLOUT_USER, IDENTITIES
from seedance.router.settings import RouterSettings, parse_replicas
from seedance.testing.servers import nats_server_binary, pinned_nats_version
from tests.unit.deploy.declared import (
    DEPLOY,
    KUBERNETES_ONLY,
    REPO,
    ServiceDecl,
    auth_choices,
    auth_users,
    compose_services,
    metric_names,
    services,
)

COMPOSE_DIR = DEPLOY / "compose"
SERVICES = compose_services()
ALL_SERVICES = services()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def scrape_ports() -> dict[str, int]:
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    ports: dict[str, int] = {}
    for job in prom["scrape_configs"]:
        (target,) = job["static_configs"][0]["targets"]
        host, port = target.rsplit(":", 1)
        assert host == job["job_name"], f"scrape job {job['job_name']} targets host {host}"
        ports[job["job_name"]] = int(port)
    return ports


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_schema_check_is_not_vacuous(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["slicer"]["restart_policy"] = "always"  # not a compose key
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid(broken)


def test_every_service_of_the_workspace_runs_in_compose(compose: dict[str, Any]) -> None:
    assert set(SERVICES) <= set(compose["services"])
    assert set(KUBERNETES_ONLY) <= set(ALL_SERVICES)  # no stale exemption
    assert not set(KUBERNETES_ONLY) & set(compose["services"])
    assert {"nats", "prometheus", "grafana"} <= set(compose["services"])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_command_image_and_build_match_the_code(compose: dict[str, Any], name: str) -> None:
    svc, decl = compose["services"][name], SERVICES[name]
    (script,) = svc["command"]
    assert decl.scripts.get(script) == f"{decl.package}.__main__:main", (script, decl.scripts)
    assert svc["build"]["args"]["SERVICE"] == name
    assert (COMPOSE_DIR / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    # The image `make images` builds: <prefix>/<service>:<version>, both settable (the check
    # runs the digest-tagged ones), the defaults naming the release.
    assert svc["image"] == (
        "${SEEDANCE_IMAGE_PREFIX:-seedance}/"
        + name
        + ":${SEEDANCE_IMAGE_TAG:-"
        + workspace_version()
        + "}"
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_env_is_settings_fields_and_ports_agree(
    compose: dict[str, Any], scrape_ports: dict[str, int], name: str
) -> None:
    svc, decl = compose["services"][name], SERVICES[name]
    env: dict[str, str] = svc["environment"]
    ours = {
        k[len(decl.env_prefix) :].lower(): v for k, v in env.items() if k.startswith("SEEDANCE_")
    }
    assert all(k.startswith(decl.env_prefix) for k in env if k.startswith("SEEDANCE_")), env
    if decl.settings is None:
        # No settings module yet (the service's issue adds it): only the port convention is
        # set, and this test checks the fields as soon as the Struct exists.
        assert set(ours) == {"http_port"}, ours
    else:
        unknown = set(ours) - decl.settings_fields
        assert not unknown, f"{name}: {sorted(unknown)} are not fields of {decl.settings}"
        assert "http_port" in decl.settings_fields
    port = int(ours["http_port"])
    assert scrape_ports[name] == port, "Prometheus scrapes another port than the service serves"
    assert str(port) in svc["expose"]
    assert env["HTTP_PORT"] == str(port)  # what the healthcheck probes
    # The endpoint binds loopback unless told: Prometheus scrapes it from another container.
    assert env[decl.env_prefix + "HTTP_HOST"] == "0.0.0.0"
    assert env["NATS_URL"] == "nats://nats:4222"


def test_the_callout_s_development_curve_seed_pairs_the_key_the_server_seals_to(
    compose: dict[str, Any],
) -> None:
    """A mismatched pair would fail every run-time login (the callout could open no request)."""

    def default(value: str) -> str:
        m = re.fullmatch(r"\$\{\w+:-(\w+)\}", value)
        assert m is not None, value
        return m.group(1)

    public = default(compose["services"]["nats"]["environment"][nats_config.CALLOUT_XKEY_VAR])
    seed = default(compose["services"][CALLOUT_USER]["environment"][XKEY_SEED_VAR])
    assert CurveKeyPair(seed).public_key == public


def test_each_service_has_its_own_nats_user_and_the_server_knows_every_password(
    compose: dict[str, Any],
) -> None:
    users = auth_users()
    nats_env = compose["services"]["nats"]["environment"]
    rendered = auth_choices().users()
    callout = (
        {nats_config.CALLOUT_ISSUER_VAR, nats_config.CALLOUT_XKEY_VAR}
        if users.get("auth_callout")
        else set()
    )
    assert set(nats_env) == {nats_config.password_var(u.name) for u in rendered} | callout
    for name in [*SERVICES, CALLOUT_USER]:
        env = compose["services"][name]["environment"]
        # compose's collector replays a recorded fleet: the declared replayer of its nodes
        user = TELEMETRY_REPLAYER if name == "telemetry-collector" else name
        assert env["NATS_USER"] == user
        assert name in IDENTITIES
        # the service's password is the same substitution as the server's variable for it
        var = nats_config.password_var(user)
        assert env["NATS_PASSWORD"] == nats_env[var]
        assert env["NATS_PASSWORD"].startswith("${" + var)


def test_the_replaying_collector_may_speak_for_exactly_the_nodes_it_replays() -> None:
    """Issue 27: compose's collector connects as ``telemetry-replayer``, whose nodes are
    ``users.yaml``'s ``replay_nodes``: the nodes of the CSV it replays, no more, no fewer."""
    csv = (REPO / "deploy" / "compose" / "collector" / "nodes.csv").read_text().splitlines()
    replayed = [line.split(",")[0] for line in csv[1:] if line.strip()]
    assert replayed
    assert auth_users()["replay_nodes"] == replayed


def test_nats_image_is_the_pinned_server_version(compose: dict[str, Any]) -> None:
    """The exact version the tests run (a `2.15-alpine` tag floats to every 2.15.x)."""
    major, minor, patch = pinned_nats_version()
    assert compose["services"]["nats"]["image"] == f"nats:{major}.{minor}.{patch}-alpine"


def test_nats_config_with_auth_is_accepted_by_the_pinned_server(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    nats = compose["services"]["nats"]
    mounts = {
        v.split(":")[1]: COMPOSE_DIR / v.split(":")[0]
        for v in nats["volumes"]
        if "/" in v.split(":")[0]
    }
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    for target, source in mounts.items():
        (conf_dir / Path(target).name).write_text(source.read_text())
    env = {**os.environ, **dict.fromkeys(nats["environment"], "x-password")}
    env[nats_config.CALLOUT_ISSUER_VAR] = new_issuer().public_key.decode()
    env[nats_config.CALLOUT_XKEY_VAR] = new_curve_keys().public_key
    cmd = [nats_server_binary(), "-c", str(conf_dir / "nats.conf"), "-t"]
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    # ...and a password missing from the server's environment is refused, not ignored.
    bad = subprocess.run(cmd, env=os.environ.copy(), capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
    assert "NATS_PASSWORD_" in bad.stderr + bad.stdout


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_dashboards_use_only_metrics_the_code_exports() -> None:
    known = metric_names()
    dashboards = sorted((COMPOSE_DIR / "grafana" / "dashboards").glob("*.json"))
    assert {d.stem for d in dashboards} == {"seedance-fleet", "seedance-routing", "seedance-cost"}
    for path in dashboards:
        board = json.loads(path.read_text())
        exprs = _exprs(board["panels"])
        assert exprs, path
        used = {m for e in exprs for m in re.findall(r"\b(?:seedance_\w+|DCGM_FI_\w+)", e)}
        assert used, path
        assert not used - known, f"{path.name}: not exported by any service: {used - known}"


def _datasource_refs(node: Any) -> list[Any]:
    """Every ``datasource`` value anywhere in a dashboard (panels, targets, variables)."""
    if isinstance(node, dict):
        found = [node["datasource"]] if "datasource" in node else []
        return found + [r for v in node.values() for r in _datasource_refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _datasource_refs(v)]
    return []


@pytest.mark.parametrize("name", ["seedance-fleet", "seedance-routing", "seedance-cost"])
def test_dashboards_name_no_fixed_datasource(name: str) -> None:
    """Importable into any Grafana: every query goes through the ``${datasource}`` variable."""
    board = json.loads((COMPOSE_DIR / "grafana" / "dashboards" / f"{name}.json").read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert not variables["datasource"].get("current"), "a saved choice would pin one uid"
    refs = _datasource_refs(board)
    assert len(refs) > len(board["panels"])  # panels and their targets at least
    assert all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), refs
    # No uid by another road (a nested object, a string-form datasource): every uid in the file
    # but the dashboard's own is the variable.
    uids = re.findall(r'"uid": "([^"]*)"', json.dumps(board))
    assert uids[0] == board["uid"] == name
    assert set(uids[1:]) == {"${datasource}"}
    assert "__inputs" not in board  # an export with fixed inputs, not a portable dashboard


def test_dashboard_variables_and_job_filters() -> None:
    """tenant/node/model variables filter the queries; DCGM series are the collector's job's."""
    boards = {
        p.stem: json.loads(p.read_text())
        for p in (COMPOSE_DIR / "grafana" / "dashboards").glob("*.json")
    }
    names = {k: {v["name"] for v in b["templating"]["list"]} for k, b in boards.items()}
    assert {"node", "model", "gpu_job"} <= names["seedance-fleet"]
    assert {"tenant", "node"} <= names["seedance-cost"]
    assert "model" in names["seedance-routing"]
    for key, board in boards.items():
        for e in _exprs(board["panels"]):
            for sel in re.findall(r"DCGM_FI_\w+(\{[^}]*\})?", e):
                assert 'job=~"$gpu_job"' in sel, (key, e)
    routing = {p["title"]: _exprs(p) for p in boards["seedance-routing"]["panels"]}
    for title in (
        "Router inference latency (p50, p99)",
        "SLO: inference requests answered OK under 100 ms",
    ):
        assert all("seedance_router_request_duration_seconds" in e for e in routing[title])
    cost = " ".join(_exprs(boards["seedance-cost"]["panels"]))
    assert "seedance_cost_ledger_idle_cost_usd_total" in cost


def test_grafana_provisioning_points_at_the_mounted_dashboards(compose: dict[str, Any]) -> None:
    provider = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "provisioning" / "dashboards" / "seedance.yaml").read_text()
    )["providers"][0]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"


# --- the Dockerfile's install step, for real ------------------------------------------------


def _install_step() -> list[str]:
    """The build stage's `uv sync ...` (after its cache and CA mounts), as `uv sync ...`."""
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    (line,) = [ln.strip() for ln in text.splitlines() if "/opt/uv/bin/uv sync " in ln]
    return ["uv", *shlex.split(line)[1:]]


#: Heavy dependencies that must stay out of another service's image.
MUST_NOT_HAVE = {"router": ["onnxruntime", "onnx"], "graph-compiler": ["lightgbm", "tritonclient"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALL_SERVICES))
def test_dockerfile_install_step_gives_only_the_services_dependencies(
    name: str, tmp_path: Path
) -> None:
    decl: ServiceDecl = ALL_SERVICES[name]
    step = [a.replace("${SERVICE}", name) for a in _install_step()]
    assert step[:3] == ["uv", "sync", "--package"]
    assert step[3] == decl.distribution
    venv = tmp_path / "venv"
    env = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_PYTHON": sys.executable,
    }
    uv = str(REPO / ".tools" / "bin" / "uv")
    done = subprocess.run(
        [uv, *step[1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    others = [s.package for s in ALL_SERVICES.values() if s.name != name]
    probe = (
        "import importlib.util as u, sys\n"
        f"import {decl.package}.__main__\n"
        f"bad = [m for m in {others + MUST_NOT_HAVE.get(name, [])!r} if u.find_spec(m)]\n"
        # Every image exports traces over OTLP/HTTP (seedance-gpu-core[otlp]).
        "bad += [f'lacks {m}' for m in [\n"
        "    'opentelemetry.exporter.otlp.proto.http.trace_exporter'] if not u.find_spec(m)]\n"
        "sys.exit(f'has or lacks: {bad}' if bad else 0)\n"
    )
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:] + ran.stdout
    assert (venv / "bin" / next(iter(decl.scripts))).exists()


def test_router_is_reachable_and_its_replica_list_names_the_triton_of_the_stack(
    compose: dict[str, Any],
) -> None:
    """The router publishes the ports its settings make it listen on, and its fallback replica
    list points at compose services that serve every routed model from a mounted repository."""
    router = compose["services"]["router"]
    env = router["environment"]
    settings = msgspec.convert(
        {
            k[len("SEEDANCE_ROUTER_") :].lower(): v
            for k, v in env.items()
            if k.startswith("SEEDANCE_ROUTER_")
        },
        RouterSettings,
        strict=False,
    )
    published = {int(p.rsplit(":", 2)[2]): int(p.rsplit(":", 2)[1]) for p in router["ports"]}
    for address in (settings.listen_address, settings.rest_address):
        port = int(address.rsplit(":", 1)[1])
        assert published.get(port) == port, f"{address} is not published on the host"
    assert published.keys() == {8001, 8000}
    replicas = parse_replicas(settings.replicas)
    models = [m.strip() for m in settings.models.split(",") if m.strip()]
    assert replicas
    assert models
    for address in replicas.values():
        host, port = address.rsplit(":", 1)
        triton = compose["services"][host]
        assert port in triton["expose"]
        assert "--model-repository=/models" in triton["command"]
        (mount,) = [v for v in triton["volumes"] if v.split(":")[1] == "/models"]
        repo = COMPOSE_DIR / mount.split(":")[0]
        for model in models:
            config = (repo / model / "config.pbtxt").read_text()
            assert f'name: "{model}"' in config
            assert (repo / model / "1" / "model.py").is_file()


#: Published ports whose clients authenticate, with how: only these may face other machines,
#: and only where the operator opens them (below).
AUTHENTICATED_PORTS = {("nats", "4222"): "NATS users and passwords from deploy/auth"}


def test_a_port_without_authentication_is_published_on_loopback_only(
    compose: dict[str, Any],
) -> None:
    """The router's 8000/8001 were published on every interface, and neither authenticates a
    client: anyone who reached the host could run inference on the fleet."""
    published = {
        (name, port.rsplit(":", 1)[1]): port
        for name, svc in compose["services"].items()
        for port in svc.get("ports", [])
    }
    assert ("router", "8000") in published
    assert ("router", "8001") in published
    for (name, container_port), spec in published.items():
        if (name, container_port) in AUTHENTICATED_PORTS:
            continue
        assert spec.startswith("127.0.0.1:"), f"{name} publishes {spec} on every interface"
        assert spec.count(":") == 2, spec


_SUBSTITUTION = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
)


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` with compose's ``${VAR}``, ``${VAR:-default}`` (unset or empty) and
    ``${VAR-default}`` (unset only) substituted from ``env``; any other ``$`` form raises, so
    that a form this does not know is never read as literal text."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m["name"], m["op"], m["arg"]
        value = env.get(name)
        if op is None:
            return value or ""
        if op == ":-":
            return value or arg
        if op == "-":
            return arg if value is None else value
        raise ValueError(f"compose form {m[0]!r} is not interpolated here")

    out = _SUBSTITUTION.sub(one, text)
    if "$" in out:
        raise ValueError(f"compose form left in {text!r}")
    return out


def test_interpolate_follows_compose_on_unset_and_empty() -> None:
    assert interpolate("${A:-d}:1", {}) == interpolate("${A:-d}:1", {"A": ""}) == "d:1"
    assert interpolate("${A-d}", {"A": ""}) == ""
    assert interpolate("${A-d}/${B}", {"A": "x", "B": "y"}) == "x/y"
    with pytest.raises(ValueError, match="not interpolated"):
        interpolate("${A:?must be set}", {})


def test_nats_client_port_is_on_loopback_unless_the_operator_opens_it(
    compose: dict[str, Any],
) -> None:
    """4222 was published on every interface by default, while every NATS password defaults to
    a public `dev-<user>` value (the operator `admin`'s included) when no `.env` sets it: any
    host that reached the machine could log in as the operator. Now loopback unless
    NATS_PUBLISH_IP (listed in .env.example, empty there) names an address."""
    (spec,) = [p for p in compose["services"]["nats"]["ports"] if p.endswith(":4222")]
    assert interpolate(spec, {}) == "127.0.0.1:4222:4222"
    assert interpolate(spec, {"NATS_PUBLISH_IP": ""}) == "127.0.0.1:4222:4222"
    assert interpolate(spec, {"NATS_PUBLISH_IP": "0.0.0.0"}) == "0.0.0.0:4222:4222"
    assert interpolate(spec, {"NATS_PUBLISH_IP": "192.0.2.7"}) == "192.0.2.7:4222:4222"
    example = (COMPOSE_DIR / ".env.example").read_text().splitlines()
    assert "NATS_PUBLISH_IP=" in example
    # the variable opens only the authenticated port: every other one is literal loopback
    opened = [
        (name, port)
        for name, svc in compose["services"].items()
        for port in svc.get("ports", [])
        if "NATS_PUBLISH_IP" in port
    ]
    assert opened == [("nats", spec)]


def test_the_provisioner_provisions_every_stream_before_any_seedance_service_starts(
    compose: dict[str, Any],
) -> None:
    """docs/security.md: the first creator of a missing stream chooses its whole configuration,
    so every service that connects as a service user waits for the provisioner's one-shot
    `seedance admin provision` to have exited 0; it runs from an image that has the CLI."""
    services_ = compose["services"]
    provision = services_["provision"]
    assert provision["command"] == ["seedance", "admin", "provision"]
    assert provision["restart"] == "no"
    env = provision["environment"]
    # the shipped provisioner, never the unrestricted operator
    assert (env["NATS_USER"], env["NATS_URL"]) == ("provisioner", "nats://nats:4222")
    assert env["NATS_PASSWORD"] == services_["nats"]["environment"]["NATS_PASSWORD_PROVISIONER"]
    image = provision["image"].split("/", 1)[1].split(":", 1)[0]
    project = tomllib.loads((REPO / "services" / image / "pyproject.toml").read_text())
    assert "seedance-gpu-sdk" in project["project"]["dependencies"], image  # the `seedance` CLI
    waiting = [
        name
        for name, svc in services_.items()
        if isinstance(deps := svc.get("depends_on"), dict)
        and deps.get("provision") == {"condition": "service_completed_successfully"}
    ]
    assert set(waiting) == {CALLOUT_USER, *SERVICES}


# --- first contact: every image `up` needs is built by it or pulled from a public registry ----

#: Images compose pulls, and the public registry that serves each. A service with `image:`, no
#: `build:` and the default pull_policy (`missing`) is pulled whenever its image is missing.
PULLED_FROM = {
    "nats": "Docker Hub, official image",
    "nvcr.io/nvidia/tritonserver": "NVIDIA NGC, public",
    "prom/prometheus": "Docker Hub",
    "grafana/grafana": "Docker Hub",
}


def unobtainable(services_: dict[str, Any]) -> dict[str, str]:
    """Service -> why a fresh machine's ``up`` may not get its image.

    - An image another service builds, run without a build: compose pulls it first under the
      default pull_policy (compose v2 before 2.13 fails; later ones forgive it only while the
      builder is in the same run): it must say ``pull_policy: never`` (``up`` builds every
      image before it creates a container).
    - One tag built by two services: compose's bake exports both at once ("image ... already
      exists" on a first build), and their images differ (compose labels each with its service).
    - Any other image-only service: pulled, so from a public registry, at a pinned tag."""
    builders: dict[str, list[str]] = {}
    for name, svc in services_.items():
        if "build" in svc:
            builders.setdefault(svc["image"], []).append(name)
    why: dict[str, str] = {}
    for name, svc in services_.items():
        image = svc["image"]
        if "build" in svc:
            if len(builders[image]) > 1:
                why[name] = f"builds {image}, as {sorted(builders[image])} do: one builder a tag"
        elif image in builders:
            if svc.get("pull_policy") != "never":
                why[name] = (
                    f"runs {image}, which only {builders[image]} builds and no registry serves, "
                    f"under pull_policy {svc.get('pull_policy', 'missing')!r}: make it 'never'"
                )
        elif reason := _not_pullable(image):
            why[name] = reason
    return why


def _not_pullable(image: str) -> str | None:
    repository, _, tag = image.rpartition(":")
    if ":" not in image.split("/")[-1]:  # no tag (a registry's port is not one)
        repository, tag = image, ""
    if repository not in PULLED_FROM:
        return f"pulls {image}, which no public registry in PULLED_FROM serves"
    if tag in ("", "latest"):
        return f"pulls {image} unpinned (pull_policy missing pulls latest every time)"
    return None


def test_a_fresh_machine_builds_or_pulls_every_image(compose: dict[str, Any]) -> None:
    """provision ran the cost-ledger's image and auth-callout the slicer's with the default
    pull_policy: compose pulled them first, from a registry that does not serve them."""
    why = unobtainable(compose["services"])
    assert not why, "\n".join(f"{name}: {reason}" for name, reason in sorted(why.items()))
    assert compose["services"]["provision"]["pull_policy"] == "never"


def test_the_image_check_names_each_kind_of_unobtainable_image(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose["services"]))
    del broken["provision"]["pull_policy"]
    broken["auth-callout"]["pull_policy"] = "missing"
    broken["router"]["image"] = broken["slicer"]["image"]
    broken["prometheus"]["image"] = "ghcr.io/example/prometheus:v3"
    broken["grafana"]["image"] = "grafana/grafana"
    why = unobtainable(broken)
    assert set(why) == {"provision", "auth-callout", "slicer", "router", "prometheus", "grafana"}
    assert "only ['cost-ledger'] builds" in why["provision"]
    assert "pull_policy 'missing'" in why["auth-callout"]
    assert "as ['router', 'slicer'] do" in why["slicer"]
    assert "no public registry" in why["prometheus"]
    assert "unpinned" in why["grafana"]


def pulled_own_images(services_: dict[str, Any]) -> list[str]:
    """Services whose image is Seedance's own (``seedance/<name>`` under the default prefix)
    and that compose may pull: any pull_policy but ``never``."""
    return sorted(
        name
        for name, svc in services_.items()
        if interpolate(svc["image"], {}).startswith("seedance/")
        and svc.get("pull_policy") != "never"
    )


def test_no_seedance_image_is_ever_pulled(compose: dict[str, Any]) -> None:
    """A plain `up` (no --build) under the default pull_policy first asked a registry for
    docker.io/seedance/<service>, a name anyone may register there, and ran what it got:
    every service on a Seedance image, those that build it included, never pulls."""
    services_ = compose["services"]
    own = {n for n, s in services_.items() if interpolate(s["image"], {}).startswith("seedance/")}
    assert own == {"provision", CALLOUT_USER, *SERVICES}
    assert pulled_own_images(services_) == []
    broken = json.loads(json.dumps(services_))
    del broken["slicer"]["pull_policy"]
    broken["router"]["pull_policy"] = "build"  # podman-compose then creates with --pull=missing
    broken["provision"]["pull_policy"] = "missing"
    assert pulled_own_images(broken) == ["provision", "router", "slicer"]
