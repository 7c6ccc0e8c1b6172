"""Routing policies for the router: one interface (`RoutingPolicy.choose`), typed inputs
(`RouteRequest`, `ReplicaState`, `Forecast`) and a typed `Decision` with a closed-set `Reason`.

Pure code: no NATS, no clocks, no globals. The router's shell builds `ReplicaState` from a
gateway candidate and `Forecast` from the latest weight table (both in `seedance.router.mapping`);
the replay simulator builds both from its simulated fleet.
"""

from seedance.router.core.policy.baselines import (
    LeastOutstanding,
    PowerOfTwoChoices,
    RoundRobin,
    least_outstanding_index,
)
from seedance.router.core.policy.late_binding import HoldOrder, LateBinding, can_take_now
from seedance.router.core.policy.predictive import (
    PredictiveConfig,
    PredictiveSloPolicy,
    PrefixIndex,
)
from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    HoldingPolicy,
    Reason,
    ReplicaForecast,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)

__all__ = [
    "Decision",
    "Forecast",
    "HoldOrder",
    "HoldingPolicy",
    "LateBinding",
    "LeastOutstanding",
    "PowerOfTwoChoices",
    "PredictiveConfig",
    "PredictiveSloPolicy",
    "PrefixIndex",
    "Reason",
    "ReplicaForecast",
    "ReplicaState",
    "RoundRobin",
    "RouteRequest",
    "RoutingPolicy",
    "can_take_now",
    "least_outstanding_index",
]
