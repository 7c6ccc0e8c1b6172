"""``seedance jobs submit --gpu-model`` as a user types it, against a slicer under its shipped
user whose one node reports its GPUs as ``T4`` (the replayed fleets' name)."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.sdk.conftest import TENANT, cli

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("slicer_up")
async def test_gpu_model_t4_finds_the_fleets_t4_and_b200_is_unsatisfiable_at_once(
    auth_url: str,
) -> None:
    for asked in ("t4", "Tesla-T4"):
        job = f"g-{uuid.uuid4().hex[:6]}"
        rc, out, err = await cli(
            auth_url, "jobs", "submit", "--tenant", TENANT, "--job", job, "--gpu-model", asked
        )
        assert (rc, err) == (0, ""), asked
        assert "placed on cli-node-" in out, asked
        assert "(whole, T4, GPUs [" in out, asked  # the model the request matched
    job = f"g-{uuid.uuid4().hex[:6]}"
    rc, out, err = await cli(
        auth_url, "jobs", "submit", "--tenant", TENANT, "--job", job, "--gpu-model", "b200"
    )
    # No node type of the fleet could hold it: said at once, with the models known, exit 1.
    assert rc == 1, (out, err)
    assert f"submitted {job} for {TENANT}" in out
    assert "unsatisfiable (gpu_models [b200] match none of the fleet's models: " in out
    assert "T4 (T4-PCIE-16GB)" in out
    assert "it stays queued in case the fleet changes" in out
