"""The images and the compose check, without an engine: what `make images` names, tags and
hashes, what the Dockerfile declares, the release's version, licence and changelog, and that
the compose check's override is the short listed diff its header says it is.

`make images` and `make compose-check` themselves build and run containers (minutes to half an
hour on 2 cores), so they are not part of `make test`; docs/deploy.md has their last lines.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from seedance.bench import compose_check, compose_stack
from seedance.bench.images import (
    CONTEXT_ROOTS,
    ImageSettings,
    containers_conf,
    digest_tag,
    image_ref,
    services,
    source_digest,
    source_files,
    workspace_version,
)
from tests.unit.deploy.declared import DEPLOY, REPO, compose_services

COMPOSE_DIR = DEPLOY / "compose"
CHECK_DIR = COMPOSE_DIR / "check"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


def _yaml(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE_DIR / "compose.yaml")


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    return _yaml(CHECK_DIR / "compose.check.yaml")


def merged(compose: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """compose's merge of an override, for the keys the override uses: mappings merge,
    everything else is replaced."""
    out = {name: dict(svc) for name, svc in compose["services"].items()}
    for name, svc in override["services"].items():
        for key, value in svc.items():
            if isinstance(value, dict) and isinstance(out[name].get(key), dict):
                out[name][key] = {**out[name][key], **value}
            else:
                out[name][key] = value
    return {"services": out}


# --- release: version, licence, changelog ---------------------------------------------------


def test_one_version_for_the_workspace_and_a_changelog_section_for_it() -> None:
    version = workspace_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert f"## [{version}]" in (REPO / "CHANGELOG.md").read_text()


def test_a_member_with_another_version_is_refused(tmp_path: Path) -> None:
    for rel in ("pyproject.toml", "libs/a/pyproject.toml", "services/b/pyproject.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('[project]\nname = "x"\nversion = "1.0.0"\n')
    assert workspace_version(tmp_path) == "1.0.0"
    (tmp_path / "services/b/pyproject.toml").write_text(
        '[project]\nname = "b"\nversion = "1.1.0"\n'
    )
    with pytest.raises(ValueError, match="disagree"):
        workspace_version(tmp_path)


def test_licence_is_apache_2_and_every_member_declares_it() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for manifest in sorted(REPO.glob("*/*/pyproject.toml")):
        project = tomllib.loads(manifest.read_text())["project"]
        assert project.get("license") == "Apache-2.0", manifest


# --- names, tags, digest ----------------------------------------------------------------------


def test_names_come_from_one_prefix_and_the_version() -> None:
    settings = ImageSettings.from_env({"SEEDANCE_IMAGE_PREFIX": "registry.example.com/acme/"})
    assert settings.prefix == "registry.example.com/acme"
    assert image_ref(settings.prefix, "slicer", "0.1.0") == "registry.example.com/acme/slicer:0.1.0"
    tag = digest_tag("0.1.0", "0123456789ab")
    assert tag == "0.1.0-src.0123456789ab"
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)  # a valid OCI tag
    assert ImageSettings.from_env({}).prefix == "seedance"


def test_every_service_gets_an_image() -> None:
    names = services()
    assert set(compose_services()) <= set(names)
    assert {"k8s-bridge", "node-agent"} <= set(names)  # Kubernetes runs them from images too


def test_the_digest_covers_exactly_what_the_build_context_lets_in(tmp_path: Path) -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert allowed == set(CONTEXT_ROOTS)
    assert "*" in ignore
    files = source_files()
    rel = {f.relative_to(REPO).as_posix() for f in files}
    assert {"uv.lock", "pyproject.toml"} <= rel
    assert any(r.startswith("libs/core/src/") for r in rel)
    assert any(r.startswith("services/slicer/src/") for r in rel)
    assert not [r for r in rel if "__pycache__" in r or r.endswith(".pyc")]
    assert not [r for r in rel if r.split("/")[0] not in CONTEXT_ROOTS]


def test_the_digest_changes_with_a_source_byte_the_base_or_a_renamed_file(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    first = source_digest(tmp_path, files, {"base": "sha256:1"})
    assert first == source_digest(tmp_path, list(reversed(files)), {"base": "sha256:1"})
    assert first != source_digest(tmp_path, files, {"base": "sha256:2"})
    (tmp_path / "b.py").write_text("y = 3\n")
    assert first != source_digest(tmp_path, files, {"base": "sha256:1"})
    (tmp_path / "b.py").write_text("y = 2\n")
    assert first == source_digest(tmp_path, files, {"base": "sha256:1"})
    (tmp_path / "b.py").rename(tmp_path / "c.py")
    moved = [tmp_path / "a.py", tmp_path / "c.py"]
    assert first != source_digest(tmp_path, moved, {"base": "sha256:1"})


# --- the Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_takes_the_base_as_an_argument_runs_non_root_and_labels_the_image() -> None:
    text = DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm" in text
    assert re.findall(r"^FROM (\S+)", text, flags=re.M) == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    (user,) = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert not user.startswith(("0", "root"))
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", text))
    assert {
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "org.opencontainers.image.licenses",
    } <= labels
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in text
    # Only the venv crosses into the runtime stage.
    assert re.findall(r"^COPY --from=(\S+) (\S+)", text, flags=re.M) == [("build", "/opt/venv")]


def test_the_debian_base_is_the_same_release_and_python_minor_as_the_official_one() -> None:
    script = (DEPLOY / "docker" / "debian-base.sh").read_text()
    text = DOCKERFILE.read_text()
    (minor,) = re.findall(r"^ARG PYTHON_VERSION=(\S+)", text, flags=re.M)
    assert "release=bookworm" in script
    assert "slim-bookworm" in text
    assert f"python{minor}" in script
    assert f"sys.version_info[:2] == ({minor.replace('.', ', ')})" in script


# --- compose: the images it names, the check's override ---------------------------------------


def test_overlays_name_the_images_make_images_builds() -> None:
    version = workspace_version()
    for overlay in ("dev", "prod"):
        doc = _yaml(DEPLOY / "k8s" / "overlays" / overlay / "kustomization.yaml")
        images = {i["name"]: i for i in doc["images"]}
        assert set(images) == {f"seedance/{s}" for s in services()}, overlay
        assert {i["newTag"] for i in images.values()} == {version}, overlay


def test_the_override_is_a_short_listed_diff(
    compose: dict[str, Any], override: dict[str, Any]
) -> None:
    text = (CHECK_DIR / "compose.check.yaml").read_text()
    assert len(text.splitlines()) <= 80
    assert set(override["services"]) <= set(compose["services"])  # changes, adds no service
    # What may change, per service (the header says why for each).
    allowed = {"network_mode", "extra_hosts", "environment"}
    stand_ins = {"nats": {"image", "command"}, "triton": {"image", "command", "healthcheck"},
                 "prometheus": {"image"}}  # fmt: skip
    for name, svc in override["services"].items():
        if name == "grafana":
            assert svc == {"profiles": ["grafana"]}  # left out: nothing packages it here
            continue
        assert set(svc) <= allowed | stand_ins.get(name, set()), (name, sorted(svc))
        assert svc["network_mode"] == "host"
        assert "image" in svc or name not in stand_ins
    env_changes = {
        name: set(svc.get("environment", {})) for name, svc in override["services"].items()
    }
    assert env_changes["router"] == {"NATS_URL", "SEEDANCE_ROUTER_REPLICAS"}
    assert env_changes["cost-ledger"] == {
        "NATS_URL", "SEEDANCE_COST_LEDGER_WINDOW_S", "SEEDANCE_COST_LEDGER_LATENESS_S",
    }  # fmt: skip
    assert all(
        v <= {"NATS_URL"} for k, v in env_changes.items() if k not in ("router", "cost-ledger")
    )


def test_every_service_name_resolves_to_loopback_and_shipped_urls_keep_their_hosts(
    compose: dict[str, Any], override: dict[str, Any]
) -> None:
    started = [n for n in compose["services"] if n != "grafana"]
    stack = merged(compose, override)["services"]
    for name in started:
        hosts = dict(h.split(":") for h in stack[name]["extra_hosts"])
        assert hosts == dict.fromkeys(started, "127.0.0.1"), name
        url = stack[name].get("environment", {}).get("NATS_URL")
        if url is not None:
            assert re.fullmatch(r"nats://nats:\d+", url)  # the shipped host name
    prom = _yaml(COMPOSE_DIR / "prometheus" / "prometheus.yml")
    targets = [t for job in prom["scrape_configs"] for t in job["static_configs"][0]["targets"]]
    assert {t.split(":")[0] for t in targets} <= set(started)  # unchanged, resolved by the hosts


def test_moved_ports_agree_and_the_check_refuses_a_taken_one(
    compose: dict[str, Any], override: dict[str, Any]
) -> None:
    stack = merged(compose, override)["services"]
    nats_port = stack["nats"]["command"][stack["nats"]["command"].index("-p") + 1]
    assert compose_stack.NATS_URL.endswith(f":{nats_port}")
    urls = {svc["environment"]["NATS_URL"] for svc in stack.values() if "environment" in svc
            and "NATS_URL" in svc["environment"]}  # fmt: skip
    assert urls == {f"nats://nats:{nats_port}"}
    grpc = [a for a in stack["triton"]["command"] if a.startswith("--grpc-port=")]
    http = [a for a in stack["triton"]["command"] if a.startswith("--http-port=")]
    assert stack["router"]["environment"]["SEEDANCE_ROUTER_REPLICAS"] == (
        f"triton-0=triton:{grpc[0].split('=')[1]}"
    )
    assert f":{http[0].split('=')[1]}/" in " ".join(stack["triton"]["healthcheck"]["test"])
    ports = {int(nats_port), int(grpc[0].split("=")[1]), int(http[0].split("=")[1]), 8222, 9090}
    # [address:]host:container; the host port
    ports |= {int(p.rsplit(":", 2)[-2]) for p in compose["services"]["router"]["ports"]}
    for name in compose_services():
        ports.add(int(compose["services"][name]["environment"]["HTTP_PORT"]))
    assert ports == set(compose_stack.HOST_PORTS)


def test_stand_ins_exist_for_the_images_that_cannot_be_pulled(override: dict[str, Any]) -> None:
    for name in ("nats", "triton", "prometheus"):
        assert override["services"][name]["image"].startswith(f"seedance-check/{name}:")
        assert (CHECK_DIR / f"{name}.Dockerfile").is_file()
        assert name in compose_check.STAND_INS
    for files in compose_check.STAND_INS.values():
        for f in files:
            if f.name != "nats-server":  # installed by `make install`, not in git
                assert f.is_file(), f


def test_services_start_in_the_order_their_conditions_declare(
    compose: dict[str, Any], override: dict[str, Any]
) -> None:
    waves = compose_stack.start_order(merged(compose, override))
    assert waves[0] == ["nats", "prometheus", "triton"]
    # the operator's provision first: no service user creates a catalogue stream (security.md)
    assert waves[1] == ["provision"]
    assert set(waves[2]) == {"auth-callout", *compose_services()}
    assert "grafana" not in {s for w in waves for s in w}  # its profile is not activated
    cyclic = {"services": {"a": {"depends_on": ["b"]}, "b": {"depends_on": {"a": {}}}}}
    with pytest.raises(ValueError, match="cycle"):
        compose_stack.start_order(cyclic)


def test_summary_line_has_the_issues_keys() -> None:
    r = compose_check.Result(images=7, services_healthy=9, panels=36, image_mb_max=412.4)
    line = compose_check.summary_line(r)
    assert re.fullmatch(
        r"compose: images=7 services_healthy=9 placed=0 costed=0 router_ok=0 compiled=0 "
        r"panels_with_data=0 panels=36 image_mb_max=412 build_s=0 up_s=0",
        line,
    ), line


def test_containers_conf_carries_the_runtime_and_limits() -> None:
    conf = containers_conf(ImageSettings.from_env({"SEEDANCE_IMAGE_ULIMITS": "nofile=512:512"}))
    assert 'default_ulimits = ["nofile=512:512"]' in conf
    assert 'runtime = "runc"' in conf
    shipped = containers_conf(ImageSettings.from_env({}))
    assert 'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]' in shipped


# --- NATS storage: what the catalogue reserves fits what the servers allow ---------------------

_SIZE = re.compile(r"max_file_store:\s*(\d+)\s*([KMGT])(i?)B?\b")
_UNITS = {"K": 1, "M": 2, "G": 3, "T": 4}
#: What the shipped servers keep beyond the reservations for the KV buckets (no byte limit).
_KV_ROOM = 2 * 1024**3
#: The shipped max_file_store before audit F2's bounds; raising it broke compose upgrades (a nats
#: not recreated: provision refused, every service waited) and Kubernetes (volumeClaimTemplates
#: cannot change): review R2, R7. A larger fleet raises it itself (docs/deploy.md).
_SHIPPED_STORE = "32G"
_SHIPPED_VOLUME = "40Gi"


def _max_file_store(conf: Path) -> int:
    """nats-server's size syntax: 10G is 10**10 bytes (its /jsz says so), 10Gi 10 * 2**30."""
    (m,) = _SIZE.findall(conf.read_text())
    number, unit, binary = m
    return int(number) * (1024 if binary else 1000) ** _UNITS[unit]


@pytest.mark.parametrize(
    ("conf", "volume"),
    [
        (DEPLOY / "compose" / "nats" / "nats.conf", None),
        (DEPLOY / "k8s" / "base" / "nats" / "nats.conf", DEPLOY / "k8s/base/nats/statefulset.yaml"),
        (DEPLOY / "k8s/overlays/dev/nats.conf", DEPLOY / "k8s/base/nats/statefulset.yaml"),
    ],
)
def test_the_servers_file_store_holds_what_the_catalogue_reserves(
    conf: Path, volume: Path | None
) -> None:
    """Streams and object stores with max_bytes reserve it at creation; past max_file_store the
    server refuses them (err_code 10047) and the services exit at start (compose-check found
    this: 10G against 22.25 GiB)."""
    from seedance.events.stores import OBJECT_STORES
    from seedance.events.subjects import STREAMS

    reserved = sum(s.max_bytes for s in STREAMS if s.max_bytes > 0)
    reserved += sum(o.max_bytes for o in OBJECT_STORES.values() if o.max_bytes > 0)
    assert reserved > 0
    allowed = _max_file_store(conf)
    # room for what reserves nothing: the KV buckets (no max_bytes), at least 2 GiB
    assert allowed - reserved >= _KV_ROOM, (allowed, reserved)
    if volume is not None:
        size = yaml.safe_load(volume.read_text())["spec"]["volumeClaimTemplates"][0]["spec"]
        gib = int(size["resources"]["requests"]["storage"].removesuffix("Gi"))
        assert gib * 1024**3 > allowed


@pytest.mark.parametrize(
    "conf",
    [
        DEPLOY / "compose" / "nats" / "nats.conf",
        DEPLOY / "k8s" / "base" / "nats" / "nats.conf",
        DEPLOY / "k8s/overlays/dev/nats.conf",
    ],
)
def test_the_shipped_file_store_and_volume_stay_what_deployments_have(conf: Path) -> None:
    """An upgrade keeps the servers' store and volume: the catalogue fits them instead."""
    assert re.search(rf"max_file_store:\s*{_SHIPPED_STORE}\n", conf.read_text()), conf
    sts = yaml.safe_load((DEPLOY / "k8s/base/nats/statefulset.yaml").read_text())
    size = sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    assert size == _SHIPPED_VOLUME


def test_every_stream_reserves_its_bytes() -> None:
    """A stream without max_bytes reserves nothing and grows into the whole max_file_store: one
    tenant's junk on SEEDANCE_JOBS refused every write of the deployment (audit F2). Bounded,
    each stream fills only its own reservation, which the test above fits into the server."""
    from seedance.events.subjects import STREAMS

    unbounded = [s.name for s in STREAMS if s.max_bytes <= 0]
    assert not unbounded, unbounded


def test_the_size_syntax_is_nats_servers() -> None:
    assert _SIZE.findall("max_file_store: 10G") == [("10", "G", "")]
    assert _SIZE.findall("max_file_store: 10Gi") == [("10", "G", "i")]


class _OneShot:
    """A compose whose ``provision`` container is in ``status`` with ``code``."""

    def __init__(self, status: str, code: str) -> None:
        self.status, self.engine = status, self
        self.stdout = code

    def state(self, container: str) -> str:
        return self.status

    def run(self, *args: str) -> _OneShot:  # engine.run("inspect", ...): its stdout
        return self


def test_a_one_shot_is_done_when_it_exited_0_and_fails_the_check_otherwise() -> None:
    done = compose_stack._completed
    assert not done(_OneShot("running", ""), "provision", "c")  # type: ignore[arg-type]
    assert not done(_OneShot("exited", "0\n"), "provision", None)  # type: ignore[arg-type]
    assert done(_OneShot("exited", "0\n"), "provision", "c")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="provision exited with 1"):
        done(_OneShot("exited", "1\n"), "provision", "c")  # type: ignore[arg-type]
