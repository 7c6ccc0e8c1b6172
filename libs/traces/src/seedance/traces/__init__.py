"""Readers of the public recordings Seedance replays: one reader per recording (Alibaba GPU
cluster, Azure LLM inference, Mooncake, the H200 serving telemetry), returning typed records.

Pure parsing: no bus, no service types; services that replay a recording (the collector's
fleet) and the benches both read through here.

Modules: `alibaba` (node and pod lists), `llm_requests` (Azure CSV, Mooncake JSONL and the
normalised `TraceRequest` list both load into), `h200` (telemetry and request log), `genai`
(the GenAI serving trace's load latencies and per-pod samples); `files`: how each opens a copy
(a byte-order mark, gzip under any name, columns in any order) and names what is wrong with one
it cannot read (file, line, column).
"""

__all__: list[str] = []
