"""The routing table gateways share: per model, each replica's forecast load and weight.

Owns: `WeightTable` (what the forecasting gateway writes into the KV bucket
``seedance-router-weights`` under ``<fleet>.<model>`` and every gateway of the fleet watches),
its encoding and `weights_from_load` (the traffic share each replica should take). Pure: no bus,
no clock; the policy's view of a table is `seedance.router.mapping.table_forecast`.

Why a table and not only the `RoutingWeights` event: the predictive policy needs each replica's
forecast arrival rate, not just a share, to weigh it against the requests in flight; the event on
the bus carries the shares for dashboards and other consumers.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

__all__ = [
    "WeightTable",
    "decode_table",
    "encode_table",
    "table_key",
    "weights_from_load",
]


class WeightTable(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    #: When the forecast was made (UTC epoch seconds): freshness is judged against it.
    made_at_s: float
    #: The forecast model version that produced it.
    model_id: str
    #: Share of new traffic each replica should take (sums to 1).
    weights: dict[str, float]
    #: Forecast requests per second, next 5 s and next 30 s.
    qps_5s: dict[str, float]
    qps_30s: dict[str, float]


def table_key(fleet: str, model: str) -> str:
    return f"{fleet}.{model}"


def encode_table(table: WeightTable) -> bytes:
    return msgspec.json.encode(table)


def decode_table(data: bytes) -> WeightTable:
    return msgspec.json.decode(data, type=WeightTable)


def weights_from_load(load: Mapping[str, float]) -> dict[str, float]:
    """Shares inversely proportional to ``1 + load`` (load: in flight now + forecast arrivals in
    the next 5 s), so a replica forecast to be busy is asked to take less; equal loads give
    equal shares. The ``1 +`` keeps an idle replica from taking everything."""
    if not load:
        return {}
    inverse = {name: 1.0 / (1.0 + max(value, 0.0)) for name, value in load.items()}
    total = sum(inverse.values())
    return {name: value / total for name, value in inverse.items()}
