"""The ``seedance`` command line's grammar: help on every flag, the version, errors in words (#19).

Before: the global flags had no help, there was no ``--version``, and a missing command said
argparse's destination name (``the following arguments are required: group``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys

import pytest

from seedance.sdk.cli_args import parse, parser


def all_parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [p]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += all_parsers(sub)
    return out


def test_every_flag_and_command_has_help() -> None:
    parsers = all_parsers(parser())
    assert len(parsers) > 15  # the walk reached the leaves (jobs submit, costs report, ...)
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in parsers
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction)
        and (not a.help or a.help == argparse.SUPPRESS)
    ]
    assert missing == []
    for p in parsers:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                assert all(helps.values()), (p.prog, helps)
                assert set(helps) == set(action.choices)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seedance.sdk.cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_version_is_the_installed_packages() -> None:
    done = run("--version")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"seedance {importlib.metadata.version('seedance-gpu-sdk')}\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "seedance: error: choose a command: jobs, admin, costs, graph (see seedance --help)"),
        (
            ("jobs",),
            "seedance jobs: error: choose a command: submit, start, finish, fail, cancel, "
            "status, list (see seedance jobs --help)",
        ),
        (("costs",), "seedance costs: error: choose a command: watch, report"),
        (("jobs", "status", "--tenant", "acme"), "the following arguments are required: --job"),
        (("jobs", "list", "--tenant", "acme", "--state", "gone"), "argument --state: invalid"),
        (
            ("--connect-timeout-s", "0", "jobs", "list", "--tenant", "acme"),
            "expected seconds > 0, got '0' (from the flag or SEEDANCE_CONNECT_TIMEOUT_S)",
        ),
    ],
)
def test_a_bad_command_line_says_what_is_missing_in_the_users_words(
    args: tuple[str, ...], says: str
) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert says in done.stderr
    for internal in ("group", "cmd", "_Parser", "Traceback"):
        assert internal not in done.stderr


def test_help_names_no_parser_internals() -> None:
    for args in ((), ("jobs",), ("jobs", "submit"), ("costs", "report"), ("graph", "compile")):
        done = run(*args, "--help")
        assert done.returncode == 0
        assert "usage: seedance" in done.stdout
        for internal in ("{jobs,", "{submit,", "GROUP", " CMD", "==SUPPRESS=="):
            assert internal not in done.stdout, (args, internal)


def test_parse_gives_the_command_and_its_flags() -> None:
    args = parse(["--connect-timeout-s", "2.5", "jobs", "list", "--tenant", "acme",
                  "--state", "placed", "--state", "waiting"])  # fmt: skip
    assert (args.group, args.cmd, args.tenant) == ("jobs", "list", "acme")
    assert args.state == ["placed", "waiting"]
    assert args.connect_timeout_s == 2.5


def test_submit_says_movable_and_its_restart_cost_only_when_asked() -> None:
    from seedance.sdk.cli import _job_event

    plain = _job_event(parse(["jobs", "submit", "--tenant", "acme", "--job", "j"]))
    assert (plain.movable, plain.restart_s) == (False, None)  # type: ignore[union-attr]
    asked = _job_event(
        parse(["jobs", "submit", "--tenant", "acme", "--job", "j", "--movable",
               "--restart-s", "240"])
    )  # fmt: skip
    assert (asked.movable, asked.restart_s) == (True, 240.0)  # type: ignore[union-attr]


def test_a_negative_restart_cost_is_refused_naming_the_field_before_connecting() -> None:
    # Port 1 refuses connections: a refusal after connecting would say so, not name the field.
    done = run("--nats-url", "nats://127.0.0.1:1", "jobs", "submit", "--tenant", "acme",
               "--job", "j", "--movable", "--restart-s", "-5")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "restart_s" in done.stderr
