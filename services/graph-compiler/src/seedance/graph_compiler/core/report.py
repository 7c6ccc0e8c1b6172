"""What a compile returns: the artifact's bytes and the report of every decision behind it.

Owns the report's types (per-node fallbacks, each candidate's outcome, the before/after
metrics, the chosen profile and every timing's verdict), which the service maps onto its
``CompileReport`` event. Pure data: must not compute anything beyond what the fields hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seedance.graph_compiler.core.accuracy import Accuracy
from seedance.graph_compiler.core.passes import PassResult
from seedance.graph_compiler.core.policy import Precision
from seedance.graph_compiler.core.profile import SessionProfile, TargetInfo
from seedance.graph_compiler.core.selection import TimingResult

__all__ = [
    "CandidateOutcome",
    "CompileReport",
    "CompileResult",
    "FallbackNode",
    "VariantMetrics",
]


@dataclass(frozen=True, kw_only=True)
class FallbackNode:
    node: str
    op_type: str
    kept_in: Precision  # the precision the node stayed in
    reason: str


@dataclass(frozen=True, kw_only=True)
class CandidateOutcome:
    precision: Precision
    accepted: bool
    reason: str
    accuracy: Accuracy | None = None
    attempts: int = 0
    fallback_nodes: int = 0
    latency_ms: float | None = None  # its best time on the target (None: not timed)
    verdict: str = ""  # why it was chosen or lost, from the timing
    name: str = ""  # the timed candidate's name where it differs from the precision

    @property
    def candidate(self) -> str:
        return self.name or str(self.precision)


@dataclass(frozen=True, kw_only=True)
class VariantMetrics:
    nodes: int
    size_bytes: int
    latency_median_ms: float | None = None  # on the target: baseline plain / chosen profile
    peak_rss_mb: float | None = None


@dataclass(frozen=True, kw_only=True)
class CompileReport:
    precision: Precision
    model_kind: str
    passes: tuple[PassResult, ...]
    accuracy: Accuracy
    fallback_nodes: tuple[FallbackNode, ...]
    candidates: tuple[CandidateOutcome, ...]
    before: VariantMetrics
    after: VariantMetrics
    profile: SessionProfile = field(default_factory=SessionProfile)
    target: TargetInfo | None = None  # None: untimed compile (no measurer)
    timings: tuple[TimingResult, ...] = ()

    @property
    def passes_fired(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes if p.fired)

    @property
    def machine(self) -> str:
        return self.target.machine if self.target else "untimed (no measurer)"


@dataclass(frozen=True, kw_only=True)
class CompileResult:
    model_bytes: bytes
    report: CompileReport
