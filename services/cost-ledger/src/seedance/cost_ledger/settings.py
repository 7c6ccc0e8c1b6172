"""The cost-ledger's settings (``SEEDANCE_COST_LEDGER_*``)."""

from __future__ import annotations

import msgspec

__all__ = ["LedgerSettings"]


class LedgerSettings(msgspec.Struct, frozen=True, kw_only=True):
    http_port: int = 9404
    #: Events per fetched batch; one compare-and-set of the totals per batch.
    batch: int = 200
    #: A price book file (YAML); the built-in book when empty.
    price_book: str = ""
    state_key: str = "default"
