"""The attack classes of `make chaos-tenants` that need more than the bus replay: a registry.

``seedance.bench.chaos_tenants`` replays an honest fleet twice, once with the hostile tenant's
bus events between its chunks (``seedance.bench.chaos_hostile``) and once without, and compares
what the honest tenants got. Attacks on other surfaces (Kubernetes pods and EndpointSlices, the
auth callout, node identities, ...) need parts that run does not start; each is an
`AttackClass` here, registered by name in `CLASSES`, and runs in a *stage* of its own (a fresh
nats-server under the generated users and the services the class attacks; `STAGES`). A stage
is opened once for all the selected classes that need it.

A class returns a `ClassOutcome`: what it sent, what the services refused, and its
``effects``: each a sentence naming something an honest tenant would notice (a pod bound by
another tenant's decision, a replica routed to from where it may not be, a login that
failed). They are added to the run's ``cross_tenant_effects``. ``figures`` are key=value pairs
for the last line (the callout flood's ``login_p99_ms``).

To add a class: a module with an ``async def`` taking the stage's object and the parsed
arguments, registered with `register` (and, if it needs parts no stage starts, a stage
registered with `register_stage`), then imported by `load`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CLASSES",
    "STAGES",
    "AttackClass",
    "ClassOutcome",
    "StageRun",
    "add_class_arguments",
    "load",
    "register",
    "register_stage",
    "run_classes",
]


@dataclass
class ClassOutcome:
    """What one attack class did and what came of it."""

    name: str
    sent: int = 0
    #: Attacks the services refused, dead-lettered or skipped, as they should.
    refused: int = 0
    #: What an honest tenant would notice (each one fails the run).
    effects: list[str] = field(default_factory=list)
    #: key=value pairs for the last line.
    figures: dict[str, str] = field(default_factory=dict)


@dataclass
class StageRun:
    """A stage's shared state: whatever its parts are (``parts``) and the service processes
    that exited (or did not stop cleanly), filled in when the stage closes."""

    parts: Any
    exits: list[str] = field(default_factory=list)


#: A stage: opened with the run's log directory and arguments, yields its `StageRun`.
Stage = Callable[[Path, argparse.Namespace], contextlib.AbstractAsyncContextManager[StageRun]]


@dataclass(frozen=True)
class AttackClass:
    name: str
    #: The `STAGES` entry it runs in.
    stage: str
    run: Callable[[Any, argparse.Namespace], Awaitable[ClassOutcome]]
    #: One line: the attack, and what must not happen.
    doc: str


CLASSES: dict[str, AttackClass] = {}
STAGES: dict[str, Stage] = {}

#: The modules that register classes and stages (imported by `load`).
MODULES = (
    "seedance.bench.chaos_k8s",
    "seedance.bench.chaos_callout",
    "seedance.bench.chaos_graph",
)


def register(cls: AttackClass) -> AttackClass:
    if cls.name in CLASSES:
        raise ValueError(f"attack class {cls.name!r} is registered twice")
    CLASSES[cls.name] = cls
    return cls


def register_stage(name: str, stage: Stage) -> Stage:
    if name in STAGES:
        raise ValueError(f"stage {name!r} is registered twice")
    STAGES[name] = stage
    return stage


def load() -> dict[str, AttackClass]:
    """Every registered class, by name (importing the modules that register them)."""
    for module in MODULES:
        importlib.import_module(module)
    return CLASSES


def add_class_arguments(p: argparse.ArgumentParser) -> None:
    """The classes' selection and the callout flood's size, on the harness's parser."""
    names = list(load())
    p.add_argument(
        "--classes",
        type=lambda v: [n for n in v.split(",") if n],
        default=names,
        help=f"attack classes to run, comma-separated (default all: {','.join(names)})",
    )
    p.add_argument("--callout-logins", type=int, default=200, help="timed logins per flood")
    p.add_argument("--callout-interval-s", type=float, default=0.05, help="a login this often")
    p.add_argument("--callout-concurrency", type=int, default=100, help="attackers per flood")
    p.add_argument("--callout-warmup-s", type=float, default=3.0, help="flood before timing")


async def run_classes(
    names: list[str], args: argparse.Namespace, logdir: Path, log: Callable[[str], None]
) -> tuple[list[ClassOutcome], list[str]]:
    """Run the classes ``names``, each stage opened once, in the order the names first need
    them; their outcomes and the stages' service exits."""
    classes = load()
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise SystemExit(f"unknown attack classes {unknown}: known {sorted(classes)}")
    by_stage: dict[str, list[AttackClass]] = {}
    for n in names:
        by_stage.setdefault(classes[n].stage, []).append(classes[n])
    outcomes: list[ClassOutcome] = []
    exits: list[str] = []
    for stage_name, members in by_stage.items():
        log(f"stage {stage_name}: {', '.join(c.name for c in members)}")
        async with _opened(STAGES[stage_name], logdir / stage_name, args, exits) as stage:
            for cls in members:
                out = await cls.run(stage.parts, args)
                log(
                    f"  {cls.name}: sent {out.sent}, refused {out.refused}, "
                    f"{len(out.effects)} effects"
                    + "".join(f", {k}={v}" for k, v in out.figures.items())
                )
                outcomes.append(out)
    return outcomes, exits


@contextlib.asynccontextmanager
async def _opened(
    stage: Stage, logdir: Path, args: argparse.Namespace, exits: list[str]
) -> AsyncIterator[StageRun]:
    run = None
    try:
        async with stage(logdir, args) as run:
            yield run
    finally:
        if run is not None:
            exits += run.exits
