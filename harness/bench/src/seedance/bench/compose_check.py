"""`make compose-check`: deploy/compose/compose.yaml brought up for real with the images
`make images` builds, used from the host as its users use it, checked, and brought down.

What it does, in order:
1. the service images (``seedance.bench.images``: rebuilt when the source digest differs, so
   the check never runs images of other sources) and stand-ins for the third-party images
   (deploy/compose/check/*.Dockerfile: NATS from the pinned server binary, Prometheus from
   Debian, Triton from nvidia-pytriton), on the same base;
2. podman-compose (pinned, from PyPI, in ``.tools/podman-compose``) with compose.yaml and the
   check's override ``deploy/compose/check/compose.check.yaml`` (host networking on loopback,
   the stand-ins, Grafana left out: its header lists every change). podman 4.3 runs no
   healthcheck by itself (its timers are systemd's) and podman-compose ignores
   ``depends_on: condition: service_healthy`` before podman 4.6, so the check runs each
   container's declared healthcheck (``podman healthcheck run``) and starts the services in the
   order the conditions declare: a service only once every dependency it names is healthy
   (a one-shot, ``provision``: exited with 0). That stack, its order and its logs are
   ``seedance.bench.compose_stack``'s; this module builds, uses, checks and counts;
3. as tenant ``acme`` with its own credentials, the ``seedance`` CLI submits two jobs and reads
   where they were placed and what they cost (and finishes them once step 4 is done); as an
   inference client, KServe v2 REST requests go to the router's published port and through it
   to the stack's Triton; the CLI, as an operator (tenants do not get the compiler's object
   store), compiles a small ONNX model through the graph-compiler;
4. after at least two of Prometheus's scrape intervals, every scrape target must be up and every
   dashboard panel's query must return series from the stack's Prometheus (the one exception
   ``seedance.bench.dashboards`` names keeps its reason);
5. ``down -v``, whatever happened; the containers' logs stay in ``out/compose-check/logs``.

The last line: ``compose: images=<n> services_healthy=<n> placed=<n> costed=<n> router_ok=<n>
compiled=<n> panels_with_data=<n> panels=<n> image_mb_max=<n> build_s=<n> up_s=<n>``; the exit
status is 0 only if every part passed.

Must not: touch a stack the user runs (its own project name, ``seedance-check``), leave
containers or volumes behind, or change compose.yaml's meaning beyond the override's listed
diff.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from seedance.bench.compose_stack import (
    NATS_URL,
    PROMETHEUS,
    ROUTER_REST,
    Compose,
    bring_up,
    ports_taken,
    save_logs,
    say,
    start_order,
)
from seedance.bench.dashboards import (
    NO_SERIES_WITHOUT_GPUS,
    dashboard_queries,
    empty_queries,
    prometheus_get,
)
from seedance.bench.images import (
    MB,
    BuiltImage,
    Engine,
    ImageSettings,
    build_images,
    source_digest,
)
from seedance.bench.images import OUT as IMAGES_OUT
from seedance.bench.repo import REPO, shown

__all__ = ["main"]

COMPOSE_DIR = REPO / "deploy" / "compose"
CHECK_DIR = COMPOSE_DIR / "check"
OUT = REPO / "out" / "compose-check"
#: Stand-in -> the files its image is built from (beside its Dockerfile in its context).
STAND_INS: dict[str, list[Path]] = {
    "nats": [REPO / ".venv" / "bin" / "nats-server"],
    "prometheus": [],
    "triton": [
        REPO / "tests" / "integration" / "router" / "triton-requirements.txt",
        CHECK_DIR / "tritonserver",
    ],
}
TENANT = "acme"
#: (job, CLI flags): 8 whole GPUs (only an A10 node of the compose fleet has them) and half a GPU.
JOBS = [("check-train", ["--gpus", "8"]), ("check-infer", ["--gpus", "1", "--gpu-milli", "500"])]
INFERENCES = 20
SEEDANCE = REPO / ".venv" / "bin" / "seedance"


# --- pure parts ---------------------------------------------------------------------------


def summary_line(r: Result) -> str:
    return (
        f"compose: images={r.images} services_healthy={r.services_healthy} placed={r.placed} "
        f"costed={r.costed} router_ok={r.router_ok} compiled={r.compiled} "
        f"panels_with_data={r.panels_with_data} panels={r.panels} "
        f"image_mb_max={r.image_mb_max:.0f} build_s={r.build_s:.0f} up_s={r.up_s:.0f}"
    )


@dataclass
class Result:
    images: int = 0
    services: int = 0
    services_healthy: int = 0
    placed: int = 0
    costed: int = 0
    router_ok: int = 0
    compiled: int = 0
    panels_with_data: int = 0
    panels: int = 0
    image_mb_max: float = 0.0
    build_s: float = 0.0
    up_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        say(f"FAIL    {what}")


# --- the phases ---------------------------------------------------------------------------


def build_stand_ins(engine: Engine, base: str) -> str:
    """Builds the stand-ins (when their digest is new); returns their tag."""
    inputs = [CHECK_DIR / f"{name}.Dockerfile" for name in STAND_INS]
    inputs += [f for files in STAND_INS.values() for f in files]
    missing = [shown(f) for f in inputs if not f.exists()]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)} (run `make install`)")
    tag = "src." + source_digest(REPO, inputs, {"base": engine.image_id(base) or base})
    for name, files in STAND_INS.items():
        ref = f"localhost/seedance-check/{name}:{tag}"
        if engine.image_id(ref) is not None:
            continue
        context = OUT / "stand-ins" / name
        context.mkdir(parents=True, exist_ok=True)
        for f in files:
            (context / f.name).write_bytes(f.read_bytes())
            (context / f.name).chmod(f.stat().st_mode)
        say(f"build   {ref} (stand-in)")
        engine.build(
            context, CHECK_DIR / f"{name}.Dockerfile", [ref], {"BASE_IMAGE": base},
            OUT / "logs" / f"build-{name}.log",
        )  # fmt: skip
    return tag


def _credentials(user: str) -> dict[str, str]:
    """The environment of a NATS user of compose's: its password as compose gives it (the
    environment, else deploy/compose/.env, else compose's development default)."""
    var = "NATS_PASSWORD_" + user.upper().replace("-", "_")
    dotenv = COMPOSE_DIR / ".env"
    values: dict[str, str] = {}
    if dotenv.exists():
        for line in dotenv.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#") and value:
                values[key.strip()] = value.strip()
    password = os.environ.get(var) or values.get(var) or f"dev-{user}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    return {**env, "NATS_URL": NATS_URL, "NATS_USER": user, "NATS_PASSWORD": password}


def cli(
    *args: str, user: str = f"tenant-{TENANT}", timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(SEEDANCE), *args], env=_credentials(user), capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip
    with open(OUT / "cli.log", "a") as log:
        log.write(f"$ NATS_USER={user} seedance {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    return done


def tenant_jobs(r: Result, timeout_s: float = 180) -> None:
    """Submit the jobs as the tenant, see where they run, wait until each is billed."""
    for job, flags in JOBS:
        done = cli("jobs", "submit", "--tenant", TENANT, "--job", job, *flags)
        line = (done.stdout or done.stderr).strip()
        say(f"tenant  $ seedance jobs submit --tenant {TENANT} --job {job} {' '.join(flags)}")
        say(f"          {line}")
        if done.returncode == 0 and "placed on" in line:
            r.placed += 1
        else:
            r.fail(f"job {job} not placed: {line}")
    deadline = time.monotonic() + timeout_s
    costs: dict[str, float] = {}
    while time.monotonic() < deadline:
        done = cli("jobs", "list", "--tenant", TENANT, "--json")
        if done.returncode == 0:
            rows = json.loads(done.stdout)  # JobStatus objects (seedance.sdk.job_status)
            costs = {row["job_id"]: row["cost"]["cost_micro_usd"] / 1e6 for row in rows}
            if all(costs.get(job, 0) > 0 for job, _ in JOBS):
                break
        time.sleep(2)  # the ledger closes a charge window every 10 s; bounded by the deadline
    r.costed = sum(1 for job, _ in JOBS if costs.get(job, 0) > 0)
    listing = cli("jobs", "list", "--tenant", TENANT)
    say(f"tenant  $ seedance jobs list --tenant {TENANT}")
    for line in listing.stdout.strip().splitlines():
        say(f"          {line}")
    if r.costed < len(JOBS):
        r.fail(f"only {r.costed} of {len(JOBS)} jobs costed within {timeout_s:.0f} s: {costs}")


def finish_jobs(r: Result) -> None:
    """The tenant finishes its jobs (after Prometheus has seen the fleet busy with them)."""
    for job, _ in JOBS:
        done = cli("jobs", "finish", "--tenant", TENANT, "--job", job)
        if done.returncode != 0 or "released at" not in done.stdout:
            r.fail(f"job {job} not released: {(done.stdout + done.stderr).strip()}")


def inference(r: Result, timeout_s: float = 180) -> None:
    """KServe v2 REST through the router's published port to the stack's Triton."""
    deadline = time.monotonic() + timeout_s
    sent = 0
    last = ""
    while r.router_ok < INFERENCES and time.monotonic() < deadline:
        data = [float(sent), 2.0, 3.0]
        body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": data}]}
        req = urllib.request.Request(
            f"{ROUTER_REST}/v2/models/echo/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                answer = json.loads(resp.read())
            (out,) = [o for o in answer["outputs"] if o["name"] == "y"]
            if out["data"] == data:
                r.router_ok += 1
                sent += 1
            else:
                r.fail(f"router answered {out['data']} for {data}")
                return
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            last = str(exc)
            time.sleep(1)  # the router connects and warms its replica up first; bounded
    say(
        f"router  {r.router_ok} of {INFERENCES} KServe v2 REST inferences echoed through the router"
    )
    if r.router_ok < INFERENCES:
        r.fail(f"router answered {r.router_ok} of {INFERENCES} correctly (last error: {last})")


def compile_model(r: Result) -> None:
    """A small BERT-style encoder through the graph-compiler, with the CLI as an operator:
    tenants do not get the compiler's object store (docs/security.md), compiles are submitted
    by an operator-side client on a tenant's behalf."""
    import onnx

    from seedance.bench.models import build_bert

    model = OUT / "encoder.onnx"
    onnx.save(build_bert(layers=1, hidden=16, heads=2, ffn=32, seq=4), str(model))
    done = cli(
        "graph", "compile", "--tenant", TENANT, "--model", str(model),
        "--out", str(OUT / "encoder.compiled.onnx"), "--json", "--timeout-s", "300",
        user="admin", timeout_s=330,
    )  # fmt: skip
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = {}
    if done.returncode == 0 and result.get("ok"):
        r.compiled = 1
        say(
            f"compile {shown(model)} -> precision {(result.get('report') or {}).get('precision')}"
            f" ({shown(OUT / 'encoder.compiled.onnx')})"
        )
    else:
        r.fail(f"compile failed: {(done.stdout + done.stderr).strip()[-800:]}")


def prometheus(r: Result, interval_s: float, timeout_s: float = 300) -> None:
    """Every target up and every panel with data, after at least two scrape intervals."""
    panels, label_queries = dashboard_queries()
    r.panels = len(panels)
    not_before = time.monotonic() + 2 * interval_s
    deadline = not_before + timeout_s
    expected = set(NO_SERIES_WITHOUT_GPUS)
    empty: list[str] = list(panels)
    down: dict[str, str] = {}
    while time.monotonic() < deadline:
        if time.monotonic() >= not_before:
            try:
                targets = prometheus_get(PROMETHEUS, "/api/v1/targets")["activeTargets"]
                empty = empty_queries(PROMETHEUS)
            except urllib.error.HTTPError as exc:  # a query Prometheus rejects: a broken panel
                r.fail(f"prometheus refused a dashboard query: {exc}")
                return
            except OSError as exc:  # not answering for a moment; bounded by the deadline
                say(f"prom    {exc}")
                time.sleep(interval_s / 3)
                continue
            down = {t["labels"]["job"]: t["lastError"] for t in targets if t["health"] != "up"}
            scraped = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            if not down and len(scraped) >= 5 and set(empty) == expected:
                break
        time.sleep(interval_s / 3)  # a third of a scrape interval; bounded by the deadline
    r.panels_with_data = sum(1 for k in panels if k not in empty)
    say(
        f"prom    targets up: {'all' if not down else 'not ' + ', '.join(sorted(down))}; "
        f"{r.panels_with_data} of {r.panels} panel queries and "
        f"{sum(1 for k in label_queries if k not in empty)} of {len(label_queries)} variables "
        "with data"
    )
    for key in sorted(expected):
        say(f"          no data, as expected: {key}: {NO_SERIES_WITHOUT_GPUS[key]}")
    if down:
        r.fail(f"scrape targets down: {down}")
    if set(empty) != expected:
        r.fail(f"queries without data: {sorted(set(empty) - expected)}")


def run(settings: ImageSettings, up_timeout_s: float) -> Result:
    r = Result()
    started = time.monotonic()
    engine, base, kind, images = build_images(settings)
    if engine.name != "podman":
        raise RuntimeError("the check drives podman-compose: it needs podman (docker found)")
    say(f"images  {len(images)} service images on {base} ({kind})")
    for image in images:
        say(f"          {_image_line(image)}")
    check_tag = build_stand_ins(engine, base)
    r.images = len(images)
    r.image_mb_max = max(i.size_bytes for i in images) / MB
    r.build_s = time.monotonic() - started
    taken = ports_taken()
    if taken:
        raise RuntimeError(f"host ports the check's stack binds are taken: {taken}")
    (digest_tag,) = {i.ref.rsplit(":", 1)[1] for i in images}
    env = {
        **engine.env,
        "SEEDANCE_IMAGE_PREFIX": settings.prefix,
        "SEEDANCE_IMAGE_TAG": digest_tag,
        "SEEDANCE_CHECK_TAG": check_tag,
    }
    compose = Compose(engine, env, OUT / "compose.log")
    config = compose.config()
    interval_s = _scrape_interval_s()
    try:
        up_started = time.monotonic()
        waves = start_order(config)
        r.services = sum(len(w) for w in waves)
        r.services_healthy = bring_up(compose, config, waves, up_timeout_s)
        r.up_s = time.monotonic() - up_started
        say(f"up      {r.services_healthy} services healthy in {r.up_s:.0f} s")
        tenant_jobs(r)
        inference(r)
        compile_model(r)
        # The jobs still run: the fleet panels (partly used GPUs, stranded memory) need them.
        prometheus(r, interval_s)
        finish_jobs(r)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        r.fail(f"{type(exc).__name__}: {exc}")
    finally:
        save_logs(compose, OUT / "logs")
        compose.run("down", "-v", check=False)
        left = compose.containers()
        if left:
            r.fail(f"containers left after down: {sorted(left)}")
        say(f"down    logs in {shown(OUT / 'logs')}")
    if r.services_healthy < r.services:
        r.fail(f"{r.services_healthy} of {r.services} services healthy")
    return r


def _image_line(image: BuiltImage) -> str:
    return (
        f"{image.ref}: {image.size_bytes / MB:.0f} MB (base + {image.over_base_mb:.0f} MB), "
        f"user {image.user}"
    )


def _scrape_interval_s() -> float:
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    value = str(prom["global"]["scrape_interval"])
    if not value.endswith("s"):
        raise ValueError(f"prometheus.yml: scrape_interval {value!r} is not in seconds")
    return float(value[:-1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="compose.yaml up for real, used, checked, down")
    p.add_argument("--up-timeout-s", type=float, default=600.0, help="for every service's health")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "compose.log").unlink(missing_ok=True)
    (OUT / "cli.log").unlink(missing_ok=True)
    IMAGES_OUT.mkdir(parents=True, exist_ok=True)
    try:
        r = run(ImageSettings.from_env(), args.up_timeout_s)
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        say(f"compose-check: {exc}")
        return 1
    if r.failures:
        say(f"failed: {len(r.failures)} check(s); see above and {shown(OUT)}")
    say(summary_line(r))
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
