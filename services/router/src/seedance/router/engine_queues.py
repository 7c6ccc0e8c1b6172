"""The engines' queue gauges, read once per planning interval for the replica planner's backlog
rule: how many requests each replica's inference server holds queued, not yet executing.

Owns where each replica's gauges are read (its configured URL, else ``http://<the replica's
host>:<metrics port>/metrics``), the scrape (all replicas at once, each bounded by a timeout),
and the parsing of the Prometheus text exposition into waiting requests per model:

* Triton: ``nv_inference_pending_request_count{model=...}`` ("requests awaiting execution",
  summed over the model's versions);
* vLLM: ``vllm:num_requests_waiting{model_name=...}`` (its scheduler's waiting queue).

Each engine names a model its own way (vLLM by its served model name, often a Hugging Face
path; Triton by its repository's name): `model_names` (router model -> engine model, the
``ENGINE_MODEL_NAMES`` setting) maps a gauge back to the router's model; a model not named there
is read under its own name.

A replica whose endpoint fails or times out, or whose exposition is not the text format or
holds a queue gauge that is not a finite count >= 0 (+Inf, NaN, 1e309, -500: an engine bug or
an endpoint that lies), is left out of this reading whole (logged with the replica, model and
value, and counted by the caller's `on_failure` by reason), never read as an empty queue: a
gauge that was not read is unknown, and one number of a lying endpoint makes all of it suspect.
Must not: decide anything (the planner does), or run on the request path.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from seedance.core.logs import get_logger

__all__ = ["QUEUE_GAUGES", "READ_FAILURES", "EngineQueues", "GaugeValueError", "parse_waiting"]

log = get_logger(__name__)

# Gauge family -> the label naming the model. prometheus_client's parser keeps vLLM's colon.
QUEUE_GAUGES: dict[str, str] = {
    "nv_inference_pending_request_count": "model",
    "vllm:num_requests_waiting": "model_name",
}


class GaugeValueError(ValueError):
    """A queue gauge whose value is no count of waiting requests (not finite, or negative)."""

    def __init__(self, model: str, value: float) -> None:
        super().__init__(
            f"waiting requests of model {model!r} read {value!r}: not a finite count >= 0"
        )
        self.model = model
        self.value = value


def _checked(model: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise GaugeValueError(model, value)
    return value


# Why a replica's reading was left out (`on_failure`'s argument; a closed set, so a metric label):
# its endpoint failed or timed out, its text is not the exposition format, or a queue gauge in
# it is no count (GaugeValueError).
READ_FAILURES = ("unreachable", "unparsable", "invalid")


def parse_waiting(text: str) -> dict[str, float]:
    """Requests waiting per model in one engine's exposition (models it exports no queue gauge
    for are absent, not zero). Raises ValueError on text that is not the exposition format,
    GaugeValueError (a ValueError) on a queue gauge that is not a finite count >= 0."""
    waiting: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        label = QUEUE_GAUGES.get(family.name)
        if label is None:
            continue
        for sample in family.samples:
            model = sample.labels.get(label)
            if model is not None and sample.name == family.name:
                # Each sample and the sum: two finite versions can still add up to +Inf.
                total = waiting.get(model, 0.0) + _checked(model, sample.value)
                waiting[model] = _checked(model, total)
    return waiting


class EngineQueues:
    """Reads the queue gauges of the replicas it is given, per router model (see the module
    docstring)."""

    def __init__(
        self,
        *,
        urls: Mapping[str, str],
        port: int,
        timeout_s: float,
        model_names: Mapping[str, str] | None = None,
        on_failure: Callable[[str], None] = lambda _reason: None,
    ) -> None:
        if port < 0 or timeout_s <= 0:
            raise ValueError(f"need port >= 0 and timeout_s > 0, got {port} and {timeout_s}")
        self._urls = dict(urls)
        self._port = port
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._model_names = dict(model_names or {})
        self._on_failure = on_failure
        self._session: aiohttp.ClientSession | None = None

    def url_for(self, replica: str, address: str) -> str | None:
        """The replica's metrics URL: the configured one, else its gRPC host at the metrics
        port (None: neither, so its queue is not read)."""
        if replica in self._urls:
            return self._urls[replica]
        if not self._port:
            return None
        host = urlsplit(f"//{address}").hostname
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host  # an IPv6 literal
        return f"http://{host}:{self._port}/metrics"

    async def read(self, addresses: Mapping[str, str]) -> dict[str, dict[str, float]]:
        """Waiting requests per model, per replica read (replica name -> its gRPC address)."""
        targets = {
            name: url
            for name, address in addresses.items()
            if (url := self.url_for(name, address)) is not None
        }
        if not targets:
            return {}
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        names = sorted(targets)
        texts = await asyncio.gather(
            *(self._fetch(self._session, targets[n]) for n in names), return_exceptions=True
        )
        out: dict[str, dict[str, float]] = {}
        for name, text in zip(names, texts, strict=True):
            try:
                if isinstance(text, BaseException):
                    raise text
                out[name] = self._by_router_model(parse_waiting(text))
            except GaugeValueError as exc:
                self._on_failure("invalid")
                log.warning(
                    "engine_queue_gauge_invalid",
                    replica=name,
                    model=exc.model,
                    value=repr(exc.value),
                    url=targets[name],
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._on_failure("unreachable")
                log.warning("engine_queue_unread", replica=name, url=targets[name], error=repr(exc))
            except (
                ValueError
            ) as exc:  # not the exposition format (after ClientError: InvalidURL is both)
                self._on_failure("unparsable")
                log.warning("engine_queue_unread", replica=name, url=targets[name], error=repr(exc))
        return out

    def _by_router_model(self, waiting: dict[str, float]) -> dict[str, float]:
        """`waiting` under the router's model names: a renamed model is read under its
        engine's name only, and only as the router's (an engine model that happens to carry
        the router's name is another model), the others under their own."""
        if not self._model_names:
            return waiting
        renamed = set(self._model_names) | set(self._model_names.values())
        out = {m: w for m, w in waiting.items() if m not in renamed}
        for model, engine in self._model_names.items():
            if engine in waiting:
                out[model] = waiting[engine]
        return out

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> str:
        async with session.get(url) as response:
            response.raise_for_status()
            return await response.text()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
