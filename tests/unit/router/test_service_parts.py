"""The router service's pure parts: selector adapter, publish queue, weights, forecast loop,
settings parsing."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.router.core.forecast import ArrivalHistory, RetrainPolicy, train_forecast_model
from seedance.router.core.forecast.live import ForecastLoop
from seedance.router.core.policy import PredictiveSloPolicy, Reason
from seedance.router.core.weight_table import (
    WeightTable,
    decode_table,
    encode_table,
    weights_from_load,
)
from seedance.router.forecast_selector import ForecastSelector, default_policy_config
from seedance.router.gateway import Candidate, ExplainingSelector
from seedance.router.publish_queue import PublishQueue
from seedance.router.settings import RouterSettings, gateway_settings, parse_replicas

T0 = 1_800_000_000.0


class _Now:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _state(name: str, outstanding: int) -> Candidate:
    return Candidate(
        name=name, address=f"{name}:1", outstanding=outstanding, outstanding_for_model=outstanding
    )


def _table(made_at_s: float, qps_5s: dict[str, float], model: str = "echo") -> WeightTable:
    return WeightTable(
        model=model,
        made_at_s=made_at_s,
        model_id="requests-g1-x",
        weights=weights_from_load({r: q * 5 for r, q in qps_5s.items()}),
        qps_5s=qps_5s,
        qps_30s=qps_5s,
    )


def _selector(now: _Now, stale_after_s: float = 5.0) -> ForecastSelector:
    policy = PredictiveSloPolicy(default_policy_config(stale_after_s=stale_after_s))
    return ForecastSelector(policy, now_s=now)


def test_selector_without_forecast_is_least_outstanding() -> None:
    selector = _selector(_Now(T0))
    assert isinstance(selector, ExplainingSelector)
    chosen, reason = selector.choose_explained("echo", [_state("a", 3), _state("b", 1)])
    assert (chosen.name, reason) == ("b", Reason.FALLBACK_NO_FORECAST.value)


def test_selector_with_fresh_forecast_steers_away_from_forecast_load() -> None:
    now = _Now(T0)
    selector = _selector(now)
    # b has fewer in flight but is forecast 10 req/s more over the next 5 s.
    assert selector.update(_table(T0 - 1.0, {"a": 0.5, "b": 10.0}))
    chosen, reason = selector.choose_explained("echo", [_state("a", 3), _state("b", 1)])
    assert (chosen.name, reason) == ("a", Reason.PREDICTED_SLO.value)
    # Another model has no table: fallback for it only.
    _, other_reason = selector.choose_explained("other", [_state("a", 3), _state("b", 1)])
    assert other_reason == Reason.FALLBACK_NO_FORECAST.value


def test_selector_with_stale_forecast_falls_back() -> None:
    now = _Now(T0)
    selector = _selector(now, stale_after_s=5.0)
    selector.update(_table(T0, {"a": 0.5, "b": 10.0}))
    now.t = T0 + 5.5
    chosen, reason = selector.choose_explained("echo", [_state("a", 3), _state("b", 1)])
    assert (chosen.name, reason) == ("b", Reason.FALLBACK_STALE_FORECAST.value)


def test_selector_keeps_the_newest_table() -> None:
    selector = _selector(_Now(T0))
    assert selector.update(_table(T0, {"a": 1.0, "b": 1.0}))
    assert not selector.update(_table(T0 - 3.0, {"a": 9.0, "b": 1.0}))
    table = selector.table("echo")
    assert table is not None
    assert table.made_at_s == T0


def test_weights_shares_and_table_encoding() -> None:
    weights = weights_from_load({"a": 0.0, "b": 1.0, "c": 3.0})
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["a"] > weights["b"] > weights["c"]
    assert weights["a"] == pytest.approx(2 * weights["b"])
    table = _table(T0, {"a": 1.5, "b": 0.25})
    assert decode_table(encode_table(table)) == table


def test_publish_queue_is_bounded_and_counts_drops() -> None:
    dropped: list[int] = []
    queue: PublishQueue[int] = PublishQueue(3, on_drop=lambda: dropped.append(1))
    accepted = [queue.offer(i) for i in range(5)]
    assert accepted == [True, True, True, False, False]
    assert queue.dropped == 2
    assert len(dropped) == 2
    assert queue.drain(2) == [0, 1]
    assert queue.offer(9)
    assert queue.drain() == [2, 9]
    assert len(queue) == 0
    with pytest.raises(ValueError, match="max_items"):
        PublishQueue(0)


def _poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_per_s * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))


def test_forecast_loop_tables_only_with_a_model_and_retrain_decision() -> None:
    loop = ForecastLoop(
        models=("echo",),
        replicas=("a", "b"),
        origin_s=T0,
        history_max_s=3600.0,
        retrain_policy=RetrainPolicy(min_history_s=300.0),
    )
    arrivals = T0 + _poisson_arrivals(4.0, 400.0, seed=1)
    for i, t in enumerate(arrivals):
        # Three quarters of the traffic to a: the forecast must say a is busier.
        loop.observe_arrival("echo", "b" if i % 4 == 0 else "a", float(t))
    now_s = T0 + 400.0
    assert loop.tick(now_s, {"echo": {"a": 0, "b": 0}}) == []
    decision = loop.retrain_decision(now_s)
    assert decision.retrain
    assert decision.reason == "no_model"
    assert decision.train_from_s == T0
    assert decision.train_until_s is not None
    history = loop.training_history(decision.train_from_s, decision.train_until_s)
    assert len(history.arrival_s) == len(arrivals)
    model = train_forecast_model(
        history, origin_s=decision.train_from_s, until_s=decision.train_until_s, generation=1
    )
    loop.install(model, trained_at_s=now_s)
    tables = loop.tick(now_s + 1.0, {"echo": {"a": 2, "b": 0}})
    assert [t.model for t in tables] == ["echo"]
    table = tables[0]
    assert table.model_id == model.version.model_id
    assert table.qps_5s["a"] > table.qps_5s["b"] > 0.0
    assert table.weights["b"] > table.weights["a"]
    # Just retrained: nothing to do until the minimum interval has passed.
    assert not loop.retrain_decision(now_s + 10.0).retrain
    assert loop.next_generation == 2


def test_forecast_loop_scores_the_model_against_the_moving_average() -> None:
    loop = ForecastLoop(models=("echo",), replicas=("a",), origin_s=T0, history_max_s=3600.0)
    history = T0 + _poisson_arrivals(3.0, 300.0, seed=2)
    for t in history:
        loop.observe_arrival("echo", "a", float(t))
    model = train_forecast_model(
        ArrivalHistory(
            arrival_s=history,
            context_tokens=np.zeros(len(history)),
            generated_tokens=np.zeros(len(history)),
        ),
        origin_s=T0,
        until_s=T0 + 300.0,
    )
    loop.install(model)
    live = T0 + 300.0 + _poisson_arrivals(3.0, 60.0, seed=3)
    tick_s = T0 + 300.0
    for t in live:
        while tick_s + 1.0 <= t:
            tick_s += 1.0
            loop.tick(tick_s, {})
        loop.observe_arrival("echo", "a", float(t))
    # ~55 scored 5-s windows of ~15 requests each.
    assert loop.scored_actual == pytest.approx(3.0 * 5 * 55, rel=0.25)
    assert loop.scored_model_abs_error > 0.0
    assert loop.scored_baseline_abs_error > 0.0


def test_settings_parse_into_gateway_settings() -> None:
    settings = RouterSettings(
        replicas="a=10.0.0.1:8001, b=10.0.0.2:8001",
        models="echo,resnet",
        input_layouts="resnet/image=nhwc:nchw",
        output_layouts="resnet/out=NHWC:NCHW",
        regions="eu-west,us-east",
    )
    gw = gateway_settings(settings)
    assert dict(gw.replicas) == {"a": "10.0.0.1:8001", "b": "10.0.0.2:8001"}
    resnet = next(m for m in gw.models if m.name == "resnet")
    assert resnet.input_layouts[0].client_layout == "NHWC"
    assert resnet.input_layouts[0].backend_layout == "NCHW"
    assert resnet.output_layouts[0].tensor == "out"
    assert gw.regions == ("eu-west", "us-east")
    with pytest.raises(ValueError, match="name=host:port"):
        parse_replicas("a=nohostport")
    with pytest.raises(ValueError, match="given twice"):
        parse_replicas("a=h:1,a=h:2")
    with pytest.raises(ValueError, match="not in SEEDANCE_ROUTER_MODELS"):
        gateway_settings(RouterSettings(models="echo", input_layouts="resnet/image=NHWC:NCHW"))
    with pytest.raises(ValueError, match="fleet"):
        RouterSettings(fleet="has.dot")
