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
    # Stable ids: the causes are random, and pytest-xdist's workers must collect the same tests.
    ids=["v7", "v4", "upper", "braced", "urn", "hex", "spaced", "not-hex", "usage", "empty"],
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


def test_a_keyed_id_needs_the_key_and_is_the_same_under_it() -> None:
    """A service publishing into a stream tenants write to keys its ids (docs/security.md,
    "Nats-Msg-Id"): without the key the id is not the one a tenant can compute, under the same
    key (another replica, a restart) it is the same; the time bits are still the cause's."""
    cause, key = str(new_event_id()), bytes(range(32))
    keyed = derived_event_id(cause, "end", key=key)
    assert keyed != derived_event_id(cause, "end")
    assert keyed == derived_event_id(cause, "end", key=bytes(range(32)))
    assert keyed != derived_event_id(cause, "end", key=bytes(range(1, 33)))
    assert keyed[:13] == cause[:13]
    assert derived_event_id("usage:j", "r", 7, key=key) != derived_event_id("usage:j", "r", 7)
    assert derived_event_id(cause, "end", key=None) == derived_event_id(cause, "end", key=b"")
