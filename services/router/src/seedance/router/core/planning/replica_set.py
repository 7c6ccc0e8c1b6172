"""The replica set a model is served by: its members, and which of them take traffic.

Owns one model of a replica set that both its writers share: the static list from settings
today, discovery (NATS KV, Kubernetes EndpointSlices) later, each producing `ReplicaMember`s;
and the planner's recommendation, which says how many of them should take traffic. Members are
kept in a stable order (the order they joined), and the routable ones are the first `target`:
scaling down drains the newest, as a Deployment scaled down removes its newest pods, and scaling
up brings back the ones that left last. Must not do: I/O or gRPC; `changes` says what the
gateway must add and remove, the service applies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ReplicaMember", "ReplicaSet", "ReplicaSetChange"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaMember:
    name: str
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSetChange:
    add: tuple[ReplicaMember, ...]
    remove: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.add and not self.remove


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSet:
    """Members in join order and how many of them take traffic (None: all of them)."""

    members: tuple[ReplicaMember, ...]
    target: int | None = None

    def __post_init__(self) -> None:
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"replica set members repeat a name: {names}")
        if self.target is not None and self.target < 1:
            raise ValueError(f"replica set target must be >= 1, got {self.target}")

    @classmethod
    def of(cls, replicas: Mapping[str, str]) -> ReplicaSet:
        """From settings' ``name -> address`` (insertion order is join order)."""
        return cls(members=tuple(ReplicaMember(name=n, address=a) for n, a in replicas.items()))

    def with_target(self, target: int | None) -> ReplicaSet:
        return ReplicaSet(members=self.members, target=target)

    def with_members(self, members: Iterable[ReplicaMember]) -> ReplicaSet:
        """Discovery's update: members still present keep their place, new ones go last."""
        incoming = {m.name: m for m in members}
        kept = [incoming.pop(m.name) for m in self.members if m.name in incoming]
        return ReplicaSet(members=(*kept, *incoming.values()), target=self.target)

    def routable(self) -> tuple[ReplicaMember, ...]:
        if self.target is None:
            return self.members
        return self.members[: self.target]

    def changes(self, registered: Sequence[str]) -> ReplicaSetChange:
        """What to add and remove so that exactly the routable members are registered."""
        want = {m.name: m for m in self.routable()}
        have = set(registered)
        return ReplicaSetChange(
            add=tuple(m for name, m in want.items() if name not in have),
            remove=tuple(name for name in registered if name not in want),
        )
