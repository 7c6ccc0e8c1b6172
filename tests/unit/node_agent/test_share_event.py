"""The node agent's per-pod shares as the bus event: ratios, order and an id no other node can
compute."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

from seedance.events import decode, encode
from seedance.events.subjects import telemetry
from seedance.events.telemetry import PodShares
from seedance.node_agent.core.share_event import MeasuredPod, pod_shares_event
from seedance.node_agent.core.shares import Share

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _pod(uid: str, gpu: int, sm: float, mem: float, **kw: str) -> MeasuredPod:
    return MeasuredPod(
        gpu_index=gpu, gpu_uuid=f"GPU-{gpu}", pod_uid=uid, share=Share(sm, mem), periods=5, **kw
    )


def test_shares_become_ratios_in_gpu_then_pod_order_under_a_random_id() -> None:
    pods = [
        _pod("b", 1, 70.0, 35.0, namespace="acme", pod="b-0", tenant="acme", job_id="train"),
        _pod("a", 1, 100.4, -0.1),  # NVML rounding past 100 % / below 0 is clamped
        _pod("c", 0, 20.0, 5.0),
    ]
    end = T0 + timedelta(seconds=1)
    event = pod_shares_event("gpu-1:example", T0, end, pods)
    assert [(s.gpu_index, s.pod_uid) for s in event.shares] == [(0, "c"), (1, "a"), (1, "b")]
    assert [(s.sm_share, s.mem_share) for s in event.shares] == [
        (0.2, 0.05), (1.0, 0.0), (0.7, 0.35),
    ]  # fmt: skip
    b = event.shares[2]
    assert (b.tenant, b.job_id, b.periods) == ("acme", "train", 5)
    assert [s.mem_used_mib for s in event.shares] == [None, None, None]  # NVML gave none
    held = dataclasses.replace(pods[0], mem_used_mib=1536.0)
    assert pod_shares_event("n", T0, end, [held]).shares[0].mem_used_mib == 1536.0
    assert (b.namespace, b.pod) == ("acme", "b-0")
    assert (event.window_start, event.at, event.node) == (T0, end, "gpu-1:example")
    # No other node can compute the id (docs/security.md, "Nats-Msg-Id"): the same window
    # built again has another; its time bits are the window's start, so ids sort by window.
    again = pod_shares_event("gpu-1:example", T0, end, pods)
    assert again.id != event.id
    assert uuid.UUID(event.id).version == 7
    assert uuid.UUID(event.id).int >> 80 == int(T0.timestamp() * 1000)
    assert decode(encode(event), PodShares) == event
    assert telemetry.pod_share("gpu-1:example") == "seedance.telemetry.gpu-1:example.pod_share"
