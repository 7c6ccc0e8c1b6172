"""Which stream sequences a stateful service has applied: its exactly-once dedupe, as entries.

Owns, per durable consumer, the sequences applied recently and the floor below which every
sequence counts as applied, and their keyed form for a `seedance.core.state_store.StateStore`
(written with the batch that applied them, so the state and what it includes are one commit).
Not a single watermark: a batch that failed is redelivered *after* later messages were applied,
and a watermark would take it for applied. The set is bounded (`kept` per durable): a message
redelivered after that many later ones were applied would be taken for applied, and
redeliveries come within seconds. It must not decide what a message does.

Entries: ``~applied/<durable>/<block>`` holds the applied sequences of one block of `block`
consecutive sequences, ``~floor/<durable>`` the floor; a batch rewrites the one or two blocks
its sequences fall in, never the whole set.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

__all__ = ["APPLIED_KEPT", "AppliedSequences"]

#: Sequences remembered per durable.
APPLIED_KEPT = 2048

_BLOCK = 256
_enc = msgspec.msgpack.Encoder()
_seqs = msgspec.msgpack.Decoder(list[int])
_int = msgspec.msgpack.Decoder(int)


class AppliedSequences:
    def __init__(self, kept: int = APPLIED_KEPT) -> None:
        self._kept = kept
        # Per durable: block number -> the applied sequences in it; and how many in all.
        self._blocks: dict[str, dict[int, set[int]]] = {}
        self._count: dict[str, int] = {}
        self._floor: dict[str, int] = {}
        self._dirty: set[tuple[str, int]] = set()  # (durable, block) to write
        self._dirty_floor: set[str] = set()

    def is_applied(self, durable: str, seq: int) -> bool:
        if seq <= self._floor.get(durable, 0):
            return True
        return seq in self._blocks.get(durable, {}).get(seq // _BLOCK, ())

    def add(self, durable: str, seq: int) -> None:
        block = self._blocks.setdefault(durable, {}).setdefault(seq // _BLOCK, set())
        if seq not in block:
            block.add(seq)
            self._count[durable] = self._count.get(durable, 0) + 1
            self._dirty.add((durable, seq // _BLOCK))

    def trim(self) -> None:
        """Raise each floor past its oldest blocks until at most `kept` sequences stay above."""
        for durable, blocks in self._blocks.items():
            while self._count[durable] > self._kept:
                oldest = min(blocks)
                dropped = blocks.pop(oldest)
                self._count[durable] -= len(dropped)
                self._floor[durable] = max(self._floor.get(durable, 0), max(dropped))
                self._dirty.add((durable, oldest))
                self._dirty_floor.add(durable)

    def changes(self) -> dict[str, bytes | None]:
        """The entries changed since the last call."""
        out: dict[str, bytes | None] = {}
        for durable, block in self._dirty:
            seqs = self._blocks.get(durable, {}).get(block)
            out[f"~applied/{durable}/{block}"] = _enc.encode(sorted(seqs)) if seqs else None
        for durable in self._dirty_floor:
            out[f"~floor/{durable}"] = _enc.encode(self._floor[durable])
        self._dirty.clear()
        self._dirty_floor.clear()
        return out

    def entries(self) -> dict[str, bytes]:
        """Every entry (a first base)."""
        self._dirty = {(d, b) for d, blocks in self._blocks.items() for b in blocks}
        self._dirty_floor = set(self._floor)
        return {k: v for k, v in self.changes().items() if v is not None}

    @classmethod
    def from_entries(
        cls, entries: Mapping[str, bytes], kept: int = APPLIED_KEPT
    ) -> AppliedSequences:
        """The sequences the entries of a store hold (other entries are ignored)."""
        out = cls(kept)
        for key, data in entries.items():
            if key.startswith("~applied/"):
                durable, _, block = key[len("~applied/") :].rpartition("/")
                seqs = set(_seqs.decode(data))
                out._blocks.setdefault(durable, {})[int(block)] = seqs
                out._count[durable] = out._count.get(durable, 0) + len(seqs)
            elif key.startswith("~floor/"):
                out._floor[key[len("~floor/") :]] = _int.decode(data)
        return out

    @classmethod
    def of(
        cls, seen: Mapping[str, list[int]], floor: Mapping[str, int], kept: int = APPLIED_KEPT
    ) -> AppliedSequences:
        """From plain lists and floors (an older format's)."""
        out = cls(kept)
        for durable, seqs in seen.items():
            for seq in seqs:
                out.add(durable, seq)
        out._floor = dict(floor)
        out._dirty.clear()
        return out
