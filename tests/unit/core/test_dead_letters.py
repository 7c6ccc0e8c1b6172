"""``DeadLetters``' id key (`seedance.core.dead_letters`): an empty key is refused.

blake2b takes an empty key as no key, so ``id_key=b""`` would derive the unkeyed ids a node can
compute and spend first in ``SEEDANCE_DLQ`` (docs/security.md, "Nats-Msg-Id"): a key that read
back empty must stop the service, not quietly unkey its letters.
"""

from __future__ import annotations

from typing import cast

import pytest

from seedance.core import Bus, DeadLetters


def test_an_empty_id_key_is_refused() -> None:
    with pytest.raises(ValueError, match="empty id_key"):
        DeadLetters(cast(Bus, None), "cost-ledger", id_key=b"")
