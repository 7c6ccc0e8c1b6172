"""`make images`: every service's image from deploy/docker/Dockerfile, with whichever container
engine is present, named from one setting and tagged by what they were built from.

Owns: choosing the engine (podman, else a docker whose daemon answers, else Debian's podman,
installed); the base image (the official Python slim image when the engine has it or can pull
it, else the Debian-built stand-in made by ``deploy/docker/debian-base.sh``); the names
(``<prefix>/<service>:<version>``, the prefix being the registry/organisation setting, the
version the workspace's); the source digest (a hash of the Dockerfile, .dockerignore, the
lock, the manifests and every source file the build context lets in, and of the base image's
id) and the tag made of it (``<version>-src.<digest>``); building an image only when no image
of that digest exists, so nothing passes on an image of other sources; the report of each
image's size, its layers over the base, its user and labels.

Must not: push anything, remove images it did not build, or decide what a service's image
holds (the Dockerfile does).

The pure parts (names, digest, the version, the report) are plain functions the unit tests
call; ``Engine`` is the one place that runs the engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seedance.bench.repo import REPO, shown

__all__ = [
    "BuiltImage",
    "Engine",
    "ImageSettings",
    "build_images",
    "containers_conf",
    "image_ref",
    "services",
    "source_digest",
    "source_files",
    "workspace_version",
]

DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
DEBIAN_BASE_SCRIPT = REPO / "deploy" / "docker" / "debian-base.sh"
OUT = REPO / "out" / "images"
#: The official base (the Dockerfile's default) and the minor version both bases carry.
PYTHON_VERSION = "3.11"
OFFICIAL_BASE = f"python:{PYTHON_VERSION}-slim-bookworm"
#: What the build context lets in (.dockerignore is an allow-list of exactly these).
CONTEXT_ROOTS = ("pyproject.toml", "uv.lock", "libs", "services")
_SKIPPED_PARTS = ("__pycache__",)
_SKIPPED_SUFFIXES = (".pyc",)
DIGEST_LEN = 12
MB = 1_000_000


@dataclass(frozen=True)
class ImageSettings:
    """What `make images` is told (SEEDANCE_IMAGE_* and the engine's settings in mk/deploy.mk)."""

    #: Registry and organisation: ``seedance`` or ``registry.example.com/seedance``.
    prefix: str = "seedance"
    #: ``auto`` (official if the engine has or can pull it, else the Debian stand-in),
    #: ``debian`` (always the stand-in) or an image reference.
    base: str = "auto"
    #: ``auto``, ``podman`` or ``docker``.
    engine: str = "auto"
    #: podman's OCI runtime (runc here: crun fails with cgroups in hybrid mode).
    podman_runtime: str = "runc"
    #: Limits every container gets (podman's defaults fail with setrlimit here); empty: none.
    ulimits: tuple[str, ...] = ("nofile=1024:1024", "nproc=1024:1024")
    #: A CA bundle the builds trust for their downloads (a TLS-inspecting proxy's); "": none.
    ca_bundle: str = ""
    #: The OCI source label: where the sources are (the checkout's origin by default).
    source_url: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ImageSettings:
        env = dict(os.environ if env is None else env)
        ulimits = env.get("SEEDANCE_IMAGE_ULIMITS", " ".join(cls.ulimits))
        return cls(
            prefix=env.get("SEEDANCE_IMAGE_PREFIX", cls.prefix).rstrip("/") or cls.prefix,
            base=env.get("SEEDANCE_IMAGE_BASE", cls.base) or cls.base,
            engine=env.get("SEEDANCE_IMAGE_ENGINE", cls.engine) or cls.engine,
            podman_runtime=env.get("SEEDANCE_PODMAN_RUNTIME", cls.podman_runtime),
            ulimits=tuple(ulimits.split()),
            ca_bundle=env.get("SEEDANCE_IMAGE_CA_BUNDLE", env.get("SSL_CERT_FILE", "")),
            source_url=env.get("SEEDANCE_IMAGE_SOURCE", ""),
        )


# --- the pure parts ---------------------------------------------------------------------------


def services(repo: Path = REPO) -> list[str]:
    """Every service of the workspace (``services/<name>/pyproject.toml``), sorted."""
    return sorted(p.parent.name for p in (repo / "services").glob("*/pyproject.toml"))


def workspace_version(repo: Path = REPO) -> str:
    """The one version every member and the workspace carry (a release bumps them together)."""
    manifests = [repo / "pyproject.toml", *sorted(repo.glob("*/*/pyproject.toml"))]
    versions = {
        str(m.relative_to(repo)): tomllib.loads(m.read_text())["project"]["version"]
        for m in manifests
    }
    found = set(versions.values())
    if len(found) != 1:
        raise ValueError(f"the workspace's members disagree on the version: {versions}")
    return found.pop()


def source_files(repo: Path = REPO) -> list[Path]:
    """The files the build context lets in (the .dockerignore allow-list), sorted."""
    found: list[Path] = []
    for root in CONTEXT_ROOTS:
        path = repo / root
        if path.is_file():
            found.append(path)
            continue
        for f in path.rglob("*"):
            rel = f.relative_to(repo)
            if (
                f.is_file()
                and not any(part in _SKIPPED_PARTS for part in rel.parts)
                and f.suffix not in _SKIPPED_SUFFIXES
            ):
                found.append(f)
    return sorted(found)


def source_digest(repo: Path, inputs: Iterable[Path], extra: dict[str, str]) -> str:
    """A hash of the files' paths and bytes and of ``extra`` (the base image's id, ...)."""
    h = hashlib.sha256()
    for f in sorted(set(inputs)):
        rel = f.relative_to(repo).as_posix().encode()
        data = f.read_bytes()
        h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
        h.update(data)
    for key in sorted(extra):
        h.update(f"\0{key}={extra[key]}".encode())
    return h.hexdigest()[:DIGEST_LEN]


def containers_conf(settings: ImageSettings) -> str:
    """podman's containers.conf for this machine: its OCI runtime and every container's limits."""
    ulimits = ", ".join(json.dumps(u) for u in settings.ulimits)
    return (
        "# written by seedance.bench.images (make images): this machine's podman settings\n"
        f"[containers]\ndefault_ulimits = [{ulimits}]\n\n"
        f'[engine]\nruntime = "{settings.podman_runtime}"\n'
    )


def image_ref(prefix: str, service: str, tag: str) -> str:
    return f"{prefix}/{service}:{tag}"


def digest_tag(version: str, digest: str) -> str:
    return f"{version}-src.{digest}"


@dataclass(frozen=True)
class BuiltImage:
    service: str
    ref: str  # <prefix>/<service>:<version>-src.<digest>: what compose-check runs
    release_ref: str  # <prefix>/<service>:<version>: what compose and k8s name
    size_bytes: int
    base_bytes: int
    user: str
    labels: dict[str, str]
    built: bool  # False: an image of this digest already existed
    build_s: float

    @property
    def over_base_mb(self) -> float:
        return (self.size_bytes - self.base_bytes) / MB


def report_lines(
    base: str, base_kind: str, base_bytes: int, images: Sequence[BuiltImage]
) -> list[str]:
    """What `make images` prints: the base apart, then each image's size over it."""
    lines = [f"base    {base} ({base_kind}): {base_bytes / MB:.0f} MB"]
    width = max((len(i.ref) for i in images), default=0)
    for i in images:
        how = f"built in {i.build_s:.0f} s" if i.built else "up to date"
        lines.append(
            f"image   {i.ref:<{width}}  {i.size_bytes / MB:5.0f} MB = base + "
            f"{i.over_base_mb:3.0f} MB  user {i.user}  ({how}; also {i.release_ref})"
        )
    return lines


# --- the engine -------------------------------------------------------------------------------


@dataclass
class Engine:
    """One container engine's command line, with this machine's settings applied."""

    name: str  # podman | docker
    settings: ImageSettings
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @classmethod
    def detect(cls, settings: ImageSettings) -> Engine:
        """podman if installed, else docker if its daemon answers, else Debian's podman."""
        wanted = settings.engine
        if wanted in ("auto", "podman") and shutil.which("podman"):
            return cls._podman(settings)
        if wanted in ("auto", "docker") and shutil.which("docker"):
            ok = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
            if ok.returncode == 0:
                return cls("docker", settings)
            if wanted == "docker":
                raise RuntimeError("docker's daemon does not answer (`docker info` failed)")
        if wanted == "docker":
            raise RuntimeError("SEEDANCE_IMAGE_ENGINE=docker but no docker is installed")
        if os.geteuid() != 0:
            raise RuntimeError(
                "no container engine: install podman (sudo apt-get install podman runc) or docker"
            )
        say("engine  neither podman nor a docker daemon: installing podman from Debian")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "podman", "runc"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        return cls._podman(settings)

    @classmethod
    def _podman(cls, settings: ImageSettings) -> Engine:
        # One containers.conf for every podman call (builds, runs, podman-compose's): the
        # runtime and the limits this machine needs.
        OUT.mkdir(parents=True, exist_ok=True)
        conf = OUT / "containers.conf"
        conf.write_text(containers_conf(settings))
        return cls("podman", settings, env={**os.environ, "CONTAINERS_CONF": str(conf)})

    def argv(self, *args: str) -> list[str]:
        return [self.name, *args]

    def run(
        self, *args: str, check: bool = True, timeout_s: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(self.argv(*args))} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done

    def image_id(self, ref: str) -> str | None:
        done = self.run("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        if done.returncode != 0:
            return None
        return done.stdout.strip() or None

    def inspect(self, ref: str) -> dict[str, object]:
        (info,) = json.loads(self.run("image", "inspect", ref).stdout)
        return dict(info)

    def size_bytes(self, ref: str) -> int:
        return int(str(self.inspect(ref)["Size"]))

    def build(self, context: Path, dockerfile: Path, tags: Sequence[str], args: dict[str, str],
              log: Path) -> float:  # fmt: skip
        """Build; the engine's output goes to ``log``. Returns the seconds it took."""
        cmd = ["build", "--network", "host", "-f", str(dockerfile)]
        for tag in tags:
            cmd += ["-t", tag]
        for key, value in args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        if self.settings.ca_bundle and Path(self.settings.ca_bundle).is_file():
            cmd += ["--secret", f"id=ca-bundle,src={self.settings.ca_bundle}"]
        if self.name == "podman":
            cmd += [f"--ulimit={u}" for u in self.settings.ulimits]
        cmd.append(str(context))
        started = time.monotonic()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            done = subprocess.run(
                self.argv(*cmd), env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        if done.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            raise RuntimeError(f"build of {tags[0]} failed; {shown(log)}:\n" + "\n".join(tail))
        return time.monotonic() - started


# --- the imperative shell ---------------------------------------------------------------------


def say(msg: str) -> None:
    print(msg, flush=True)


def ensure_base(engine: Engine, settings: ImageSettings) -> tuple[str, str]:
    """(base image reference, what it is). Builds the Debian stand-in when it must."""
    if settings.base not in ("auto", "debian"):
        if engine.image_id(settings.base) is None:
            engine.run("pull", settings.base, timeout_s=900)
        return settings.base, "as given"
    if settings.base == "auto":
        if engine.image_id(OFFICIAL_BASE) is not None:
            return OFFICIAL_BASE, "the official image"
        pulled = engine.run("pull", OFFICIAL_BASE, check=False, timeout_s=300)
        if pulled.returncode == 0:
            return OFFICIAL_BASE, "the official image"
        reason = (pulled.stderr.strip().splitlines() or ["no answer"])[-1]
        say(f"base    cannot pull {OFFICIAL_BASE} ({reason[:160]}): the Debian stand-in instead")
    # The stand-in is tagged by its script's hash: a changed script makes a new base.
    script_digest = source_digest(REPO, [DEBIAN_BASE_SCRIPT], {})
    ref = f"localhost/seedance-base/python:{PYTHON_VERSION}-bookworm-debootstrap.{script_digest}"
    if engine.image_id(ref) is None:
        say(f"base    building {ref} with debootstrap (a few minutes)")
        subprocess.run(
            ["bash", str(DEBIAN_BASE_SCRIPT), engine.name, ref, str(OUT / "base")],
            check=True,
            env=engine.env,
        )
    return ref, "Debian bookworm via debootstrap, standing in for " + OFFICIAL_BASE


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def build_images(
    settings: ImageSettings, names: Sequence[str] | None = None
) -> tuple[Engine, str, str, list[BuiltImage]]:
    """Build (or find up to date) every service's image: (engine, base, what it is, images)."""
    engine = Engine.detect(settings)
    base, base_kind = ensure_base(engine, settings)
    base_id = engine.image_id(base) or ""
    base_bytes = engine.size_bytes(base)
    version = workspace_version()
    inputs = [*source_files(), DOCKERFILE, REPO / ".dockerignore"]
    digest = source_digest(REPO, inputs, {"base": base_id})
    revision = _git("rev-parse", "HEAD")
    if revision and _git("status", "--porcelain", "--", *CONTEXT_ROOTS, "deploy/docker"):
        revision += "-dirty"
    source = settings.source_url or _git("remote", "get-url", "origin")
    built: list[BuiltImage] = []
    for service in names or services():
        ref = image_ref(settings.prefix, service, digest_tag(version, digest))
        release = image_ref(settings.prefix, service, version)
        took, fresh = 0.0, engine.image_id(ref) is None
        if fresh:
            say(f"build   {ref}")
            took = engine.build(
                REPO,
                DOCKERFILE,
                [ref, release],
                {
                    "SERVICE": service,
                    "BASE_IMAGE": base,
                    "PYTHON_VERSION": PYTHON_VERSION,
                    "VERSION": version,
                    "SOURCE": source,
                    "REVISION": revision,
                    "SOURCE_DIGEST": digest,
                },
                OUT / "logs" / f"{service}.log",
            )
        else:
            engine.run("tag", ref, release)  # the release name follows the current sources
        info = engine.inspect(ref)
        config = dict(info.get("Config") or {})  # type: ignore[call-overload]
        built.append(
            BuiltImage(
                service=service,
                ref=ref,
                release_ref=release,
                size_bytes=int(str(info["Size"])),
                base_bytes=base_bytes,
                user=str(config.get("User") or "root"),
                labels=dict(config.get("Labels") or {}),
                built=fresh,
                build_s=took,
            )
        )
    return engine, base, base_kind, built


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="build every Seedance service image (make images)")
    p.add_argument("services", nargs="*", help="only these services (default: all)")
    args = p.parse_args(argv)
    settings = ImageSettings.from_env()
    unknown = set(args.services) - set(services())
    if unknown:
        p.error(
            f"no such service: {', '.join(sorted(unknown))} (services: {', '.join(services())})"
        )
    started = time.monotonic()
    try:
        engine, base, kind, images = build_images(settings, args.services or None)
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        say(f"images: {exc}")
        return 1
    base_bytes = images[0].base_bytes if images else 0
    for line in report_lines(base, kind, base_bytes, images):
        say(line)
    root = [i.ref for i in images if i.user in ("root", "0", "0:0")]
    if root:
        say(f"images: running as root: {', '.join(root)}")
        return 1
    say(
        f"images: engine={engine.name} images={len(images)} "
        f"built={sum(i.built for i in images)} base_mb={base_bytes / MB:.0f} "
        f"image_mb_max={max((i.size_bytes for i in images), default=0) / MB:.0f} "
        f"build_s={time.monotonic() - started:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
