"""The gateway's replica selector: the predictive policy on a fresh forecast, least-outstanding
otherwise.

Owns: `ForecastSelector`, the adapter between the gateway's `ReplicaSelector` protocol and
`PredictiveSloPolicy`, and the latest `WeightTable` per model it decides from (the policy's views
of a candidate and of a table are `mapping.py`'s). Must not do I/O or predict: it runs on every
request, so it only reads the table the forecast loop (or the KV watch) last handed it. The
reason it returns is the policy's closed `Reason` set.

A Triton request carries no token counts, so each replica is presented to the policy as
`running = requests in flight`, no prompt tokens and an unbounded KV pool: every replica then has
the same predicted TTFT and the policy's tie-break decides, i.e. the fewest requests in flight
plus forecast arrivals over the next 5 s. With no table, or one older than the policy's
`max_forecast_age_s`, the policy itself falls back to least-outstanding and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from seedance.router.core.policy import (
    Forecast,
    PredictiveConfig,
    PredictiveSloPolicy,
    RouteRequest,
)
from seedance.router.core.weight_table import WeightTable
from seedance.router.gateway import Candidate
from seedance.router.mapping import replica_state, table_forecast

__all__ = ["ForecastSelector", "default_policy_config"]

_REQUEST = RouteRequest(prompt_tokens=1)


def default_policy_config(*, stale_after_s: float) -> PredictiveConfig:
    """The policy's replica profile. Without token counts only the knobs that do not depend on
    them matter; the profile is the simulator's H200 one (docs/router-sim.md)."""
    return PredictiveConfig(
        prefill_tokens_per_s=7_000.0,
        prefill_overhead_s=0.02,
        decode_step_s=0.02,
        max_forecast_age_s=stale_after_s,
    )


class ForecastSelector:
    """`ExplainingSelector` over `PredictiveSloPolicy`; `update()` installs a newer table."""

    def __init__(self, policy: PredictiveSloPolicy, *, now_s: Callable[[], float]) -> None:
        self._policy = policy
        self._now_s = now_s
        self._tables: dict[str, WeightTable] = {}
        self._forecasts: dict[str, Forecast] = {}

    def update(self, table: WeightTable) -> bool:
        """Keep `table` unless the one held for its model was made later; True if kept."""
        held = self._tables.get(table.model)
        if held is not None and held.made_at_s > table.made_at_s:
            return False
        self._tables[table.model] = table
        self._forecasts[table.model] = table_forecast(table)
        return True

    def table(self, model: str) -> WeightTable | None:
        return self._tables.get(model)

    def choose(self, model: str, replicas: Sequence[Candidate]) -> Candidate:
        return self.choose_explained(model, replicas)[0]

    def choose_explained(self, model: str, replicas: Sequence[Candidate]) -> tuple[Candidate, str]:
        if not replicas:
            raise ValueError(f"no replica to choose from for model {model!r}")
        states = [replica_state(r) for r in replicas]
        forecast = self._forecasts.get(model)
        decision = self._policy.choose(_REQUEST, states, forecast, self._now_s())
        return replicas[decision.replica_index], decision.reason.value
