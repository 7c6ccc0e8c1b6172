"""Every console script of the workspace answers ``--help`` and ``--version`` with an empty
environment, before it reads a setting or connects anywhere (issue 28).

The scripts are read from the workspace's pyproject files (the root's members globs, each
member's ``[project.scripts]``), so a new entry point is covered without touching this test.
Each runs as a user or an image would start it: the installed console script, under
``env -i PATH=...``. A service's help names every ``SEEDANCE_<SVC>_*`` variable its settings
Struct declares.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.unit.deploy.declared import REPO, services

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def workspace_scripts() -> dict[str, str]:
    """Console script -> the distribution that declares it, for every workspace member."""
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts: dict[str, str] = {}
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        for pyproject in sorted(REPO.glob(f"{pattern}/pyproject.toml")):
            project = tomllib.loads(pyproject.read_text())["project"]
            for script in project.get("scripts", {}):
                scripts[script] = project["name"]
    return scripts


SCRIPTS = workspace_scripts()
#: Script -> the settings variables its help must name (services only).
SERVICE_VARIABLES = {
    script: sorted(decl.env_prefix + f.upper() for f in decl.settings_fields)
    for decl in services().values()
    for script in decl.scripts
}


def run_bare(*argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` with nothing in the environment but a PATH (``env -i PATH=...``)."""
    return subprocess.run(
        list(argv),
        env={"PATH": f"{BIN}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_the_scripts_are_read_from_the_workspace() -> None:
    # Not vacuous: the services', the CLI's and the auth callout's are all found.
    assert {"seedance", "seedance-auth", "seedance-node-agent", "seedance-slicer"} <= set(SCRIPTS)
    assert set(SERVICE_VARIABLES) <= set(SCRIPTS)
    assert len(SERVICE_VARIABLES) == len(services())


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_exits_0_with_an_empty_environment(script: str) -> None:
    done = run_bare(str(BIN / script), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}"), done.stdout[:500]
    assert done.stderr == ""  # no log line, no warning: nothing was started
    missing = [v for v in SERVICE_VARIABLES.get(script, []) if v not in done.stdout]
    assert not missing, f"{script} --help does not name {missing}"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_version_exits_0_with_an_empty_environment(script: str) -> None:
    done = run_bare(str(BIN / script), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{script} {importlib.metadata.version(SCRIPTS[script])}\n"
    assert done.stderr == ""


def test_an_argument_is_refused_not_ignored() -> None:
    # A flag where a variable was meant would otherwise run the service with the default.
    done = run_bare(str(BIN / "seedance-slicer"), "--pool", "gpu-a")
    assert done.returncode == 2
    assert "unrecognized arguments: --pool gpu-a" in done.stderr


def test_an_otlp_exporter_asked_for_and_missing_ends_with_the_extra_to_install() -> None:
    # The exporter's module made unimportable, as in an environment without the extra.
    probe = (
        "import sys\n"
        "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
        "sys.argv = ['seedance-slicer']\n"
        "from seedance.slicer.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PATH": f"{BIN}:/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "otlp"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("seedance-slicer: OTEL_TRACES_EXPORTER=otlp")
    assert "install the core library's extra `seedance-gpu-core[otlp]`" in line
