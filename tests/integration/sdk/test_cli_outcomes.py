"""The CLI under a tenant's own credentials hears the slicer's answer (issue 13).

A real nats-server runs the generated ``deploy/auth/nats-auth.conf``; the slicer runs under its
own user; every command is a real ``seedance`` subprocess under ``tenant-acme``'s user with no
inbox flag. Before: the CLI could not run with tenant credentials (no inbox prefix), exited 0
on a duplicate or unknown job, blamed a missing graph compiler for a refused permission, and
printed nothing of what the slicer decided.
"""

from __future__ import annotations

import uuid

import pytest

from seedance.sdk import SeedanceClient
from seedance.sdk.client import JobRejectedError, PermissionRefused
from tests.integration.conftest import shipped_password
from tests.integration.sdk.conftest import TENANT, cli

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("slicer_up")
async def test_the_cli_reports_placements_releases_and_rejections_with_tenant_credentials(
    auth_url: str,
) -> None:
    job = f"j-{uuid.uuid4().hex[:6]}"
    rc, out, err = await cli(auth_url, "jobs", "submit", "--tenant", TENANT, "--job", job)
    assert (rc, err) == (0, "")
    assert f"submitted {job} for {TENANT}" in out
    assert "placed on cli-node-" in out
    # Another request under the live id: rejected, said, non-zero.
    rc, out, err = await cli(
        auth_url, "jobs", "submit", "--tenant", TENANT, "--job", job, "--gpus", "2"
    )
    assert rc == 1
    assert "rejected (duplicate_job)" in err
    rc, out, err = await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", job)
    assert rc == 0
    assert "released at" in out
    assert "it held resources" in out
    rc, out, err = await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", job)
    assert rc == 1
    assert "rejected (job_ended)" in err
    rc, out, err = await cli(auth_url, "jobs", "cancel", "--tenant", TENANT, "--job", "ghost")
    assert rc == 1
    assert "rejected (unknown_job)" in err


@pytest.mark.usefixtures("slicer_up")
async def test_bounds_are_checked_before_publishing_and_refusals_name_the_subject(
    auth_url: str,
) -> None:
    rc, _, err = await cli(
        auth_url, "jobs", "submit", "--tenant", TENANT, "--job", "x", "--gpus", str(2**64 + 1)
    )
    assert rc == 2
    assert "$.request.gpus" in err
    assert str(2**64 + 1) in err
    # acme's user publishing as globex: the server refuses, and the CLI says so.
    rc, _, err = await cli(auth_url, "jobs", "submit", "--tenant", "globex", "--job", "x")
    assert rc == 1
    assert "refused" in err
    assert "seedance.slicing.globex.*" in err  # the first thing it tried: its answers
    assert "graph compiler" not in err
    # A wrong inbox prefix is named too (here: nats-py's default, which acme may not use).
    rc, _, err = await cli(
        auth_url, "--inbox-prefix", "_INBOX", "jobs", "submit", "--tenant", TENANT, "--job", "y"
    )
    assert rc == 1
    assert "refused" in err
    assert "_INBOX." in err


@pytest.mark.usefixtures("slicer_up")
async def test_the_sdk_waits_and_raises_with_tenant_credentials(auth_url: str) -> None:
    user = f"tenant-{TENANT}"
    async with await SeedanceClient.connect(
        auth_url, user=user, password=shipped_password(user)
    ) as c:
        job = f"s-{uuid.uuid4().hex[:6]}"
        out = await c.submit_job(TENANT, job, gpus=1, wait_s=10)
        assert out.decision is not None
        assert out.decision.job_id == job
        with pytest.raises(JobRejectedError) as info:
            await c.job_started(TENANT, "never-submitted", wait_s=10)
        assert info.value.rejection.reason == "unknown_job"
        assert (await c.job_started(TENANT, job, wait_s=1)).decision is None  # not answered
        with pytest.raises(PermissionRefused) as refused:
            await c.finish_job("globex", job)  # no wait: the publish itself is refused
        assert refused.value.subject == "seedance.jobs.globex.finished"
        with pytest.raises(PermissionRefused) as refused:
            await c.finish_job("globex", job, wait_s=10)  # reading globex's answers, first
        assert refused.value.subject == "seedance.slicing.globex.*"
