"""What the live service feeds the planner: outcomes by arrival, the engines' queue gauges as
queued prefill work, and where those gauges are read."""

from __future__ import annotations

import pytest

from seedance.router.core.planning.planner import ReplicaCapacity
from seedance.router.engine_queues import EngineQueues, parse_waiting
from seedance.router.planner_feed import OutcomesByArrival, observed_slo, queued_prefill_s
from seedance.router.settings import RouterSettings, engine_model_names, parse_engine_metrics

CAPACITY = ReplicaCapacity(
    prefill_tokens_per_s=1000.0,
    prefill_overhead_s=0.5,
    decode_step_s=0.03,
    kv_capacity_tokens=100_000,
)

TRITON = """\
# HELP nv_inference_pending_request_count Pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="slow",version="1"} 3
nv_inference_pending_request_count{model="slow",version="2"} 2
nv_inference_pending_request_count{model="echo",version="1"} 0
# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="slow",version="1"} 120
"""

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 64.0
"""


def test_waiting_requests_are_read_from_triton_and_vllm_gauges_only() -> None:
    assert parse_waiting(TRITON) == {"slow": 5.0, "echo": 0.0}  # versions summed
    assert parse_waiting(VLLM) == {"llama": 7.0}  # running requests are not waiting
    assert parse_waiting("# nothing here\n") == {}  # no gauge: unknown, not zero


def test_outcomes_are_filed_under_their_arrival_bin_and_taken_once() -> None:
    outcomes = OutcomesByArrival(15.0)
    outcomes.record("m", 29.9, met=True)
    outcomes.record("m", 16.0, met=False)
    outcomes.record("m", 30.0, met=True)
    outcomes.record("n", 1.0, met=True)
    assert outcomes.take() == {"m": ((15.0, 1, 2), (30.0, 1, 1)), "n": ((0.0, 1, 1),)}
    assert outcomes.take() == {}
    with pytest.raises(ValueError, match="bin_s"):
        OutcomesByArrival(0.0)


def test_the_observation_counts_queued_work_at_the_ready_replicas_whose_gauge_was_read() -> None:
    gauges = {"a": {"m": 2.0}, "b": {"m": 4.0, "other": 9.0}, "c": {"other": 1.0}}
    got = observed_slo(
        "m",
        ((15.0, 3, 4), (30.0, 1, 1)),
        gauges=gauges,
        ready=["a", "c", "d"],  # b is not ready; c and d have no gauge for m
        capacity=CAPACITY,
        prompt_tokens=500,
        slo_s=1.5,
    )
    assert (got.met, got.requests) == (4, 5)
    assert got.by_arrival == ((15.0, 3, 4), (30.0, 1, 1))
    assert got.groups(99.0) == got.by_arrival  # filed by arrival, not at the decision
    assert got.ready == 1
    assert got.backlog_s == pytest.approx(2 * (0.5 + 0.5))
    assert got.behind == 1  # a's 2 s of queued work is behind the 1.5 s SLO
    assert got.served_s == pytest.approx(5 * 1.0)
    assert queued_prefill_s(3, CAPACITY, 1000) == pytest.approx(4.5)
    unread = observed_slo(
        "m", (), gauges={}, ready=["a"], capacity=CAPACITY, prompt_tokens=500, slo_s=1.5
    )
    assert unread.backlog_s is None  # no gauge read: the backlog rule stays off
    assert unread.ready == 0
    assert unread.served_s is None


def test_each_replica_s_gauges_come_from_its_url_or_its_host_at_the_metrics_port() -> None:
    queues = EngineQueues(urls={"a": "http://x:9/metrics"}, port=8002, timeout_s=1.0)
    assert queues.url_for("a", "10.0.0.1:8001") == "http://x:9/metrics"
    assert queues.url_for("b", "10.0.0.2:8001") == "http://10.0.0.2:8002/metrics"
    assert queues.url_for("c", "[fd00::1]:8001") == "http://[fd00::1]:8002/metrics"
    alone = EngineQueues(urls={}, port=0, timeout_s=1.0)
    assert alone.url_for("b", "10.0.0.2:8001") is None


def test_engine_metrics_settings_are_checked_at_start_up() -> None:
    assert parse_engine_metrics(" a=http://h:8002/metrics , b=https://g/m ") == {
        "a": "http://h:8002/metrics",
        "b": "https://g/m",
    }
    with pytest.raises(ValueError, match="is not name=http"):
        parse_engine_metrics("a=h:8002")
    with pytest.raises(ValueError, match="given twice"):
        parse_engine_metrics("a=http://h/m,a=http://g/m")
    with pytest.raises(ValueError, match="engine_metrics_port"):
        RouterSettings(engine_metrics_port=70000)


def test_engine_model_names_are_checked_at_start_up_naming_the_bad_entry() -> None:
    settings = RouterSettings(
        models="llama,echo",
        engine_model_names=" llama = meta-llama/Llama-3.1-70B-Instruct ",
    )
    assert engine_model_names(settings) == {"llama": "meta-llama/Llama-3.1-70B-Instruct"}
    assert engine_model_names(RouterSettings(models="echo")) == {}
    with pytest.raises(ValueError, match=r"entry 'llama' is not router_model=engine_model"):
        RouterSettings(models="llama", engine_model_names="llama")
    with pytest.raises(ValueError, match=r"entry 'llama=' is not router_model=engine_model"):
        RouterSettings(models="llama", engine_model_names="llama=")
    with pytest.raises(ValueError, match=r"entry 'llama=b': model 'llama' given twice"):
        RouterSettings(models="llama", engine_model_names="llama=a,llama=b")
    with pytest.raises(ValueError, match=r"entry mistral=m: 'mistral' is not in SEEDANCE_ROUTER"):
        RouterSettings(models="llama", engine_model_names="mistral=m")
    # Two router models reading one engine model's queue (by mapping, or a mapping onto
    # another routed model's own name) would count it twice.
    with pytest.raises(ValueError, match=r"models 'a' and 'b' would both read engine model 'x'"):
        RouterSettings(models="a,b", engine_model_names="a=x,b=x")
    with pytest.raises(ValueError, match=r"models 'a' and 'b' would both read engine model 'b'"):
        RouterSettings(models="a,b", engine_model_names="a=b")


async def test_a_gauge_is_read_under_the_router_s_model_name_its_engine_s_mapped() -> None:
    """vLLM labels its queue by its served model name (here a Hugging Face path); the mapping
    reads it as the router's model. An engine model that merely carries a renamed router
    model's name is another model, not read as it."""
    exposition = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 7.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="llama"} 99.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="echo"} 2.0\n'
    )
    plain = EngineQueues(urls={"r": "http://r/metrics"}, port=0, timeout_s=1.0)
    mapped = EngineQueues(
        urls={"r": "http://r/metrics"},
        port=0,
        timeout_s=1.0,
        model_names={"llama": "meta-llama/Llama-3.1-8B"},
    )

    async def fetch(_session: object, _url: str) -> str:
        return exposition

    for queues in (plain, mapped):
        queues._fetch = fetch  # type: ignore[method-assign]
    try:
        unmapped = (await plain.read({"r": "r:8001"}))["r"]
        assert unmapped["llama"] == 99.0  # without the mapping: the wrong model's queue
        assert (await mapped.read({"r": "r:8001"}))["r"] == {"llama": 7.0, "echo": 2.0}
    finally:
        await plain.close()
        await mapped.close()
