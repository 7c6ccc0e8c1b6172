"""The hostile-tenant soak in its short CI form: `make chaos-tenants` with a small fleet.

The soak runs the slicer and the cost-ledger as processes under the generated NATS users, a
hostile tenant with its own credentials among three honest ones, then the same honest fleet
alone (seedance.bench.chaos_tenants says what each figure means), then the attack classes of
other surfaces (forged job ids on pods, rogue EndpointSlices, a login flood on the auth
callout, reads, writes and malformed uploads against another tenant's compile;
seedance.bench.chaos_classes), each in its own stage. Its last line must report no
service exit, no effect on an honest tenant (a failed login of the flooded tenant is one) and
totals equal to the offline recompute, the hostile tenant must have been answered (rejections)
and dead-lettered, not ignored, and the flood's ``login_p99_ms`` must be printed (its goal is
the bench's to judge, not this test's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_a_hostile_tenant_changes_nothing_for_the_others() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.chaos_tenants",
            "--jobs",
            "45",
            "--nodes",
            "6",
            "--property",
            "80",
            "--chunk",
            "150",
            "--callout-logins",
            "30",
            "--callout-concurrency",
            "50",
            "--callout-warmup-s",
            "1.5",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{last}\n{done.stderr[-6000:]}"
    figures = dict(re.findall(r"(\w+)=([\w.]+)", last))
    assert last.startswith("tenants: "), last
    assert figures["service_exits"] == "0", done.stderr[-4000:]
    assert figures["cross_tenant_effects"] == "0", done.stderr[-4000:]
    assert figures["diff_usd"] == "0.00", done.stderr[-4000:]
    assert int(figures["hostile"]) >= 100
    assert int(figures["rejected"]) > 0, "the hostile tenant was never answered"
    assert int(figures["dead_lettered"]) > 0, "nothing hostile reached a dead letter"
    assert int(figures["classes"]) >= 4, last  # the compile surface's class among them
    assert "compile-cross-tenant: sent " in done.stdout + done.stderr, last
    assert int(figures["class_attacks"]) > 0, last
    assert re.fullmatch(r"[\d.]+|inf", figures["login_p99_ms"]), last
