"""Readers of the public recordings Seedance replays: one reader per recording (Alibaba GPU
cluster, Azure LLM inference, Mooncake, the H200 serving telemetry), returning typed records.

Pure parsing: no bus, no service types; services that replay a recording (the collector's
fleet) and the benches both read through here.

Modules: `alibaba` (node and pod lists), `llm_requests` (Azure CSV, Mooncake JSONL and the
normalised `TraceRequest` list both load into), `h200` (telemetry and request log).
"""

__all__: list[str] = []
