"""A bad allocation query is refused at once, before the API reads the stream or waits for its
index: a refusal that waited on a replica still reading its index came after the asker's
patience (tests/integration/ledger/test_allocation_api.py timed out on a loaded machine)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import BusSettings, ServiceRuntime
from seedance.cost_ledger.allocation_api import AllocationApi
from seedance.events import encode
from seedance.events.allocation import AllocationQuery, AllocationRefusal
from seedance.events.subjects import api

YEAR_1_END = "0001-01-02T00:00:00Z"


def unstarted_api() -> AllocationApi:
    """An API whose runtime never started: any read of the bus raises."""
    runtime = ServiceRuntime(
        "cost-ledger", BusSettings(url="nats://127.0.0.1:1"), registry=CollectorRegistry()
    )
    return AllocationApi(runtime, replica="r", rightsizer=None)


@pytest.mark.parametrize(
    ("tenant", "query", "parameter"),
    [
        ("acme", AllocationQuery(window="999999d"), "window"),
        ("acme", AllocationQuery(window=f"0001-01-01T00:00:00+01:00,{YEAR_1_END}"), "window"),
        ("acme", AllocationQuery(window="a week"), "window"),
        ("acme", AllocationQuery(window="7d", aggregate="colour"), "aggregate"),
        ("acme", AllocationQuery(window="7d", include_idle=True), "include_idle"),
        (None, AllocationQuery(window="7d", rightsize=True), "rightsize"),
    ],
)
async def test_a_bad_query_is_refused_without_reading_the_stream(
    tenant: str | None, query: AllocationQuery, parameter: str
) -> None:
    reply = await unstarted_api().answer(api.allocation(tenant), encode(query))
    assert isinstance(reply, AllocationRefusal)
    assert reply.parameter == parameter
