"""The router's pure core: typed inputs to typed decisions, no I/O.

Owns: `forecast` (the LightGBM request-count and KV-occupancy forecasters, their features and the
live forecaster state the service ticks), `policy` (the per-request routing policies and their
vocabulary), `planning` (the replica planner, its load forecast and the replica set it sizes) and
`weight_table` (the per-model table the forecaster writes and every gateway routes from).

Must not: import nats, grpc, prometheus_client or structlog, read a clock, or touch files (the
import-linter contract "Service cores do no I/O" enforces the imports); callers pass times in.
numpy, lightgbm and msgspec are allowed: they compute and encode, they do no I/O. The shell
(`gateway/`, `service.py`, `forecast_store.py`, `mapping.py`) builds the inputs and acts on the
outputs.
"""
