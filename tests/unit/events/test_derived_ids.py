"""`derived_event_id` is a pure function of its inputs: the same cause and role give the same id
in every process and release (a re-published effect must carry the id it had). Pinned against
the reference it was written as (uuid.UUID's parse and text), which its fast path must equal."""

from __future__ import annotations

import hashlib
import random
import uuid

import pytest

from seedance.events import derived_event_id, new_event_id


def reference(cause_id: str, role: str, unix_ms: int | None = None) -> str:
    digest = int.from_bytes(hashlib.blake2b(f"{cause_id}/{role}".encode(), digest_size=10).digest())
    if unix_ms is not None:
        ms = unix_ms
    else:
        try:
            ms = uuid.UUID(cause_id).int >> 80
        except ValueError:
            ms = 0
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((digest >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= digest & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def test_a_known_cause_keeps_its_id() -> None:
    cause = "0192f3a4-5b6c-7d8e-9f01-23456789abcd"
    assert derived_event_id(cause, "placement/0/0") == reference(cause, "placement/0/0")
    assert derived_event_id(cause, "placement/0/0") == "0192f3a4-5b6c-798d-ab2b-1af068ce91f9"


@pytest.mark.parametrize(
    "cause",
    [
        new_event_id(1_767_225_600_000),
        str(uuid.uuid4()),
        str(uuid.uuid4()).upper(),
        "{" + str(uuid.uuid4()) + "}",
        "urn:uuid:" + str(uuid.uuid4()),
        uuid.uuid4().hex,
        " " + str(uuid.uuid4()),
        str(uuid.uuid4())[:-1] + "g",
        "usage:job-1:node-a:2026-03-01T12:00:r0",
        "",
    ],
)
def test_every_form_of_cause_gives_the_reference_id(cause: str) -> None:
    assert derived_event_id(cause, "released/t/j") == reference(cause, "released/t/j")
    assert derived_event_id(cause, "r", unix_ms=42) == reference(cause, "r", unix_ms=42)


def test_random_causes_give_the_reference_ids() -> None:
    rng = random.Random(31)
    for _ in range(2_000):
        cause = str(uuid.UUID(int=rng.getrandbits(128)))
        role = f"placement/{rng.randrange(3)}/{rng.randrange(128)}"
        assert derived_event_id(cause, role) == reference(cause, role)
