"""``seedance jobs status|list`` under a tenant's own credentials, against a real slicer (#19).

A real nats-server runs the shipped ``deploy/auth/nats-auth.conf``; the slicer runs under its
own user with one node of two T4s; every command is a ``seedance`` subprocess under
``tenant-acme``. Before: a user could not see what became of a job at all once the submit's
``--wait-s`` was over (no ``jobs status`` or ``jobs list``).
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.integration.sdk.conftest import TENANT, cli

pytestmark = pytest.mark.slow


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_status_says_where_a_job_runs_why_another_waits_and_how_each_ended(
    auth_url: str, slicer_up: str
) -> None:
    node = slicer_up
    placed, waits, refused = unique("placed"), unique("waits"), unique("refused")
    assert (await cli(auth_url, "jobs", "submit", "--tenant", TENANT, "--job", placed))[0] == 0
    # Two GPUs on a pool of one two-GPU node, one of them taken: it waits, and says why.
    rc, out, _ = await cli(
        auth_url, "jobs", "submit", "--tenant", TENANT, "--job", waits, "--gpus", "2"
    )
    assert rc == 0
    assert "waiting (" in out
    # Nine GPUs per member: over the slicer's 8 per node, refused (it will never run).
    rc, _, err = await cli(
        auth_url, "jobs", "submit", "--tenant", TENANT, "--job", refused, "--gpus", "9"
    )
    assert rc == 1
    assert "rejected (invalid_request)" in err

    rc, out, err = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", placed)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["job", placed, "(tenant", f"{TENANT})"]
    assert lines[1].split() == ["state", "placed"]
    assert f"placed on {node} (whole, T4, GPUs [0])" in out
    assert "nothing billed yet" in out  # no ledger runs here (test_job_to_cost has one)

    rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", waits)
    assert rc == 0
    assert out.splitlines()[1].split() == ["state", "waiting"]
    assert "waiting (no_capacity: " in out

    rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", refused)
    assert rc == 0
    assert "rejected (invalid_request): gpus=9 per gang member exceeds 8 GPUs per node" in out

    # Machines get the slicer's own events.
    rc, out, _ = await cli(
        auth_url, "jobs", "status", "--tenant", TENANT, "--job", placed, "--json"
    )
    assert rc == 0
    status = json.loads(out)
    assert status["state"] == "placed"
    assert status["tenant"] == TENANT
    assert [p["node"] for p in status["placements"]] == [node]
    assert status["placements"][0]["type"] == "slice.placement.v1"
    assert status["cost"] == {
        "cost_micro_usd": 0, "gpu_hours_micro": 0, "entries": 0, "report": None
    }  # fmt: skip

    # An end is a release; a later refused request about the job is said beside its state.
    # (the waiting job cancelled first: the finished job's GPU would place it)
    assert (await cli(auth_url, "jobs", "cancel", "--tenant", TENANT, "--job", waits))[0] == 0
    assert (await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", placed))[0] == 0
    assert (await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", placed))[0] == 1
    rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", placed)
    assert out.splitlines()[1].split() == ["state", "finished"]
    assert f"finished, released (ran on {node} (whole, T4, GPUs [0]))" in out
    assert "refused    a later job.finished.v1: job_ended" in out
    rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", waits)
    assert "cancelled, released (never placed)" in out


async def test_list_is_one_line_per_job_filtered_by_state(auth_url: str, slicer_up: str) -> None:
    node = slicer_up
    a, b = unique("a"), unique("b")
    assert (await cli(auth_url, "jobs", "submit", "--tenant", TENANT, "--job", a))[0] == 0
    assert (await cli(auth_url, "jobs", "submit", "--tenant", TENANT, "--job", b))[0] == 0
    assert (await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", b))[0] == 0

    rc, out, err = await cli(auth_url, "jobs", "list", "--tenant", TENANT)
    assert (rc, err) == (0, "")
    head, *rows = out.splitlines()
    assert head.split() == ["JOB", "STATE", "SINCE", "COST", "USD", "GPU-H", "WHERE", "/", "WHY"]
    by_job = {r.split()[0]: r.split() for r in rows}
    assert by_job[a][1] == "placed"
    assert by_job[a][3:] == ["0.000000", "0.000", node, "[0]"]
    assert by_job[b][1] == "finished"
    # In the order the slicer first decided: a before b.
    assert list(by_job).index(a) < list(by_job).index(b)

    rc, out, _ = await cli(auth_url, "jobs", "list", "--tenant", TENANT, "--state", "finished")
    assert rc == 0
    states = {r.split()[1] for r in out.splitlines()[1:]}
    assert states == {"finished"}
    assert b in out
    assert a not in out

    rc, out, _ = await cli(
        auth_url, "jobs", "list", "--tenant", TENANT, "--state", "placed", "--json"
    )
    assert rc == 0
    listed = json.loads(out)
    assert {s["state"] for s in listed} == {"placed"}
    assert a in [s["job_id"] for s in listed]

    # No job in a state: said on stderr, the table is not printed; still a success.
    rc, out, err = await cli(auth_url, "jobs", "list", "--tenant", TENANT, "--state", "preempted")
    assert (rc, out) == (0, "")
    assert f"no jobs of tenant {TENANT} in state preempted" in err


async def test_an_unknown_job_and_another_tenants_jobs_exit_non_zero(
    auth_url: str, slicer_up: str
) -> None:
    ghost = unique("ghost")
    # A refused end of it is no job either (the slicer never knew it).
    assert (await cli(auth_url, "jobs", "cancel", "--tenant", TENANT, "--job", ghost))[0] == 1
    rc, out, err = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", ghost)
    assert (rc, out) == (1, "")
    assert err.startswith(f"seedance: the bus knows no job {ghost!r} of tenant {TENANT!r}")
    assert len(err.splitlines()) == 1
    # acme's user asking for globex's jobs: the server refuses reading globex's decisions.
    for args in (("status", "--job", "x"), ("list",)):
        rc, out, err = await cli(auth_url, "jobs", *args[:1], "--tenant", "globex", *args[1:])
        assert (rc, out) == (1, "")
        assert "refused" in err
        assert "seedance.slicing.globex.*" in err
        assert len(err.splitlines()) == 1
