"""The graph-compiler service: compile requests in, artifacts and reports out.

Each request on ``seedance.graph.<tenant>.request`` (durable ``compiler-requests``) is answered
with exactly one ``CompileResult`` on ``seedance.graph.<tenant>.result``:

* the model is read from the tenant's own upload chunks (``uploads.py``: what a tenant's user
  can send), fetched from the object store (``inputs/<tenant>/...``, operators) or from a URL or
  local path with its sha256 checked; a URL only within the fetch policy (``fetch.py``: allowed
  schemes, hosts and networks, a size limit and a deadline);
* the compatibility check for the request's target and the compile run in a child process
  (CPU-heavy: the event loop keeps serving the bus and the health endpoint), while the message
  is kept alive with ``in_progress`` heartbeats so its 300 s ack_wait never expires mid-compile;
* the artifact goes, up to ``max_inline_artifact_mib``, in chunks on the tenant's artifact
  subjects when the model was uploaded so, else into the object store; above that it is
  written under ``artifact_dir`` (sent by reference: path and sha256);
* a model that cannot be compiled, and a request that cannot be served (bad sha256, missing
  object, unknown target), get ``ok=False`` with a named ``error_kind`` on the tenant's result
  subject, where the user waits; only a message that does not decode goes to the dead-letter
  stream, and a bad upload (a missing chunk, too large, a sha256 mismatch) is also
  dead-lettered with the reason, since its bytes came over the bus. No artifact is stored
  unless the compile passed its checks.

Who compiles for a GPU: each worker announces its capability (the execution providers its
onnxruntime really loads, and the targets that makes it able to answer) in the
``seedance-graph-workers`` KV bucket under its worker id, re-announced every ``announce_s`` (the
bucket's TTL drops a worker that stopped). A ``cuda`` or ``transformer-gpu`` request is compiled
only by a worker with ``CUDAExecutionProvider``, since candidates are timed where they will run;
a worker without it hands the request back (nak with backoff) while a GPU worker is announced,
and answers ``error_kind=NoGpuWorker`` with the reason when none is, or on the last delivery.

Results are idempotent by request id: the result is recorded in ``seedance-graph-results``
after it is published, a request already answered is acknowledged without compiling again, and
the result's event id is derived from the tenant and request id, keyed (`ids`: no tenant can
spend it first), so a replica racing on the same request publishes a duplicate the stream drops.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from prometheus_client import Counter, Histogram

from seedance.core import (
    Clock,
    Delivery,
    Lifecycle,
    RetryableError,
    ServiceRuntime,
    WallClock,
    cancel_until_done,
)
from seedance.core.holder import default_holder
from seedance.core.id_key import derived_id_key
from seedance.core.kv import ensure_bucket, ensure_object_store, live_entries
from seedance.core.logs import get_logger
from seedance.events.dlq import DeadLetter
from seedance.events.graph import (
    CompilerCapability,
    CompileRequest,
    CompileResult,
    artifact_object_name,
)
from seedance.events.stores import BUCKETS
from seedance.events.subjects import consumer, dlq, graph
from seedance.graph_compiler import mapping, pool, uploads, worker
from seedance.graph_compiler.fetch import FetchError, UrlFetcher
from seedance.graph_compiler.ids import bad_upload_id, result_id
from seedance.graph_compiler.settings import GraphCompilerSettings

__all__ = ["RESULTS_BUCKET", "WORKERS_BUCKET", "GraphCompilerMetrics", "GraphCompilerService"]

log = get_logger(__name__)

RESULTS_BUCKET = "seedance-graph-results"
WORKERS_BUCKET = "seedance-graph-workers"
_MIB = 1024**2
_SHA256_HEX = frozenset("0123456789abcdef")


class BadRequest(Exception):
    """The request cannot be served as sent; answered with ``error_kind=InvalidRequest``."""


class GraphCompilerMetrics:
    def __init__(self, registry: Any) -> None:
        self.compiles_total = Counter(
            "seedance_graph_compiler_compiles_total",
            "Compile requests answered, by outcome (ok or the error kind).",
            ["outcome"],
            registry=registry,
        )
        self.duplicates_total = Counter(
            "seedance_graph_compiler_duplicate_requests_total",
            "Requests already answered (acknowledged without compiling).",
            registry=registry,
        )
        self.heartbeats_total = Counter(
            "seedance_graph_compiler_heartbeats_total",
            "in_progress sent for requests still compiling (keeps ack_wait from expiring).",
            registry=registry,
        )
        self.compile_seconds = Histogram(
            "seedance_graph_compiler_compile_seconds",
            "Time from fetch to stored artifact, per request.",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )


class GraphCompilerService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        settings: GraphCompilerSettings,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._rt = runtime
        self._settings = settings
        self._clock = clock or WallClock()
        self.metrics = GraphCompilerMetrics(runtime.registry)
        self._max_deliver = consumer("compiler-requests").max_deliver
        self._store: ObjectStore | None = None
        self._kv: KeyValue | None = None
        self._id_key = b""  # the ids' secret (`ids`), read from the results bucket
        self._pool: ProcessPoolExecutor | None = None
        self._fetcher = UrlFetcher(settings.fetch_policy(), clock=self._clock)
        self._workers: KeyValue | None = None
        self._capability: worker.Capability | None = None
        self._announcer: asyncio.Task[None] | None = None
        # The key of this worker's announcement: another worker's under the same key would be
        # overwritten, skipped as "this one" by _workers_for, and deleted at this one's stop.
        # ``<host>-<pid>`` was shared by hosts named alike with one pid (pid 1 in containers),
        # and by a restart reusing its predecessor's pid; the shared default adds 4 random hex.
        self._worker_id = settings.worker_id or default_holder()
        # One message per fetch: fetched messages wait in hand with their ack_wait running, and
        # a compile takes minutes; more throughput comes from more replicas sharing the durable.
        runtime.consume("compiler-requests", CompileRequest, self._handle, batch=1)

    async def start(self) -> None:
        await self._rt.start()
        self._store = await ensure_object_store(self._rt.bus, self._settings.object_store)
        self._kv = await ensure_bucket(self._rt.bus, RESULTS_BUCKET)
        self._id_key = await self._read_id_key()
        self._workers = await ensure_bucket(self._rt.bus, WORKERS_BUCKET)
        self._pool = pool.new_pool(self._settings.compile_memory_mib)
        # Asking the child what it can run also pays its imports (onnx, onnxruntime, onnxscript:
        # seconds) before the first request.
        loop = asyncio.get_running_loop()
        self._capability = await loop.run_in_executor(self._pool, worker.capability)
        await self._announce()
        self._announcer = asyncio.create_task(self._announce_forever())
        log.info(
            "compiler_capability_announced",
            worker_id=self._worker_id,
            providers=list(self._capability.providers),
            targets=list(self._capability.targets),
        )

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        if self._announcer is not None:
            await cancel_until_done([self._announcer])  # it publishes: one cancel can be lost
            self._announcer = None
            if self._workers is not None:
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                    await self._workers.delete(self._worker_id)
        await self._rt.stop()

    # --- capability -------------------------------------------------------------------------

    async def _announce(self) -> None:
        assert self._workers is not None
        assert self._capability is not None
        cap = CompilerCapability(
            worker_id=self._worker_id,
            providers=list(self._capability.providers),
            machine=self._capability.machine,
            targets=list(self._capability.targets),
        )
        await self._workers.put(self._worker_id, msgspec.msgpack.encode(cap))

    async def _announce_forever(self) -> None:
        while True:
            await self._clock.sleep(self._settings.announce_s)
            try:
                await self._announce()
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                # The next round tries again; the bucket's TTL is three rounds.
                log.warning("compiler_capability_announce_failed", error=repr(exc))

    async def _workers_for(self, target: str) -> list[CompilerCapability]:
        """The announced workers, other than this one, that can answer ``target``."""
        assert self._workers is not None
        out = []
        # live_entries, not nats-py's keys(): that can return part of them (nats-io/nats.py#842);
        # the values come with the listing, no get() per worker
        for key, entry in (await live_entries(self._workers)).items():
            if key == self._worker_id or not entry.value:
                continue
            cap = msgspec.msgpack.decode(entry.value, type=CompilerCapability)
            if target in cap.targets:
                out.append(cap)
        return out

    async def _not_for_me(self, d: Delivery[CompileRequest]) -> CompileResult | None:
        """None when this worker can compile the request's target; else a NoGpuWorker answer,
        or a RetryableError (the request goes back for a capable worker) while one is
        announced and deliveries remain."""
        req = d.event
        cap = self._capability
        if cap is None or req.target in cap.targets:
            return None
        need = worker.needs_provider(req.target)
        others = await self._workers_for(req.target)
        if others and d.num_delivered < self._max_deliver:
            names = ", ".join(c.worker_id for c in others)
            raise RetryableError(f"target {req.target} needs {need}; left for {names}")
        why = (
            f"announced workers with {need} ({', '.join(c.worker_id for c in others)}) did not "
            f"take it in {d.num_delivered} deliveries"
            if others
            else f"no graph-compiler worker with {need} is announced in {WORKERS_BUCKET}"
        )
        return self._failure(
            req,
            "NoGpuWorker",
            f"target {req.target} is compiled only where its candidates can be timed on {need}; "
            f"this worker has {', '.join(cap.providers)}, and {why}",
        )

    async def _read_id_key(self) -> bytes:
        """The ids' key (`ids`), put again past half the bucket's TTL: one in use never expires."""
        assert self._kv is not None
        ttl_s = BUCKETS[RESULTS_BUCKET].ttl_s
        return await derived_id_key(self._kv, refresh_after_s=ttl_s / 2, clock=self._clock)

    async def close(self) -> None:
        try:
            await self._rt.close()  # raises after closing when NATS was unreachable
        finally:
            if self._pool is not None:
                pool.kill_pool(self._pool)
                self._pool = None

    # --- one request ------------------------------------------------------------------------

    async def _handle(self, d: Delivery[CompileRequest]) -> None:
        assert self._kv is not None
        req = d.event
        key = f"{req.tenant}.{req.request_id}"
        try:
            await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            pass
        else:
            self.metrics.duplicates_total.inc()
            log.info("compile_request_duplicate", tenant=req.tenant, request_id=req.request_id)
            return
        started = self._clock.monotonic()
        try:
            self._id_key = await self._read_id_key()  # a failure answers on the last delivery
            # The heartbeat covers the whole handling (fetching and storing large models take
            # time too), so ack_wait never expires and hands the request to another replica.
            async with self._heartbeat(d):
                result = await self._serve(d)
        except Exception as exc:
            if d.num_delivered < self._max_deliver:
                raise  # retried (nak with backoff) by the consumer
            # The last delivery: the user waiting on the result subject gets the reason.
            result = self._failure(req, "InternalError", f"{type(exc).__name__}: {exc}")
        await self._rt.bus.publish(graph.subject(req.tenant, "result"), result)
        await self._kv.put(key, msgspec.msgpack.encode(result))
        self.metrics.compiles_total.labels("ok" if result.ok else result.error_kind).inc()
        self.metrics.compile_seconds.observe(self._clock.monotonic() - started)
        log.info("compile_answered", tenant=req.tenant, request_id=req.request_id, ok=result.ok,
                 error_kind=result.error_kind,
                 precision=result.report.precision if result.report else None)  # fmt: skip

    async def _serve(self, d: Delivery[CompileRequest]) -> CompileResult:
        req = d.event
        try:
            policy = mapping.core_policy(req.policy, req.target, self._settings.measure_runs)
        except ValueError as exc:
            return self._failure(req, "InvalidRequest", str(exc))
        refusal = await self._not_for_me(d)
        if refusal is not None:
            return refusal
        work_dir = self._settings.work_dir or None
        with tempfile.TemporaryDirectory(prefix="seedance-gc-", dir=work_dir) as tmp:
            model_path = Path(tmp) / "model.onnx"
            out_path = Path(tmp) / "compiled.onnx"
            try:
                await self._fetch(req, model_path)
            except uploads.UploadError as exc:
                await self._dead_letter(d, str(exc))
                return self._failure(req, "InvalidRequest", str(exc))
            except BadRequest as exc:
                return self._failure(req, "InvalidRequest", str(exc))
            outcome = await self._compile(d, model_path, out_path, policy)
            if outcome.error_kind is not None:
                return self._failure(req, outcome.error_kind, outcome.error or "")
            try:
                where = await self._store_artifact(req, out_path, outcome.artifact_bytes)
            except BadRequest as exc:
                return self._failure(req, "ArtifactTooLarge", str(exc))
        return CompileResult(
            id=result_id(req.tenant, req.request_id, key=self._id_key),
            at=self._clock.now(),
            request_id=req.request_id,
            tenant=req.tenant,
            model_name=req.model_name,
            ok=True,
            artifact_sha256=outcome.artifact_sha256,
            report=outcome.report,
            **where,
        )

    def _failure(self, req: CompileRequest, kind: str, error: str) -> CompileResult:
        return CompileResult(
            id=result_id(req.tenant, req.request_id, key=self._id_key), at=self._clock.now(),
            request_id=req.request_id, tenant=req.tenant, model_name=req.model_name, ok=False,
            error_kind=kind, error=error[:4000],
        )  # fmt: skip

    # --- fetching ---------------------------------------------------------------------------

    async def _fetch(self, req: CompileRequest, dest: Path) -> None:
        sources = (req.model_object is not None, req.model_url is not None, req.model_chunks != 0)
        if sum(sources) != 1:
            raise BadRequest("give exactly one of model_object, model_url and model_chunks")
        want = _check_sha256(req.model_sha256) if req.model_sha256 is not None else None
        if req.model_chunks:
            if want is None:
                raise BadRequest("model_chunks needs model_sha256 (64 hex digits)")
            await uploads.read_upload(
                self._rt.bus,
                tenant=req.tenant,
                request_id=req.request_id,
                chunks=req.model_chunks,
                sha256=want,
                max_bytes=int(self._settings.max_model_mib * _MIB),
                timeout_s=self._settings.upload_timeout_s,
                dest=dest,
            )
            return
        if req.model_object is not None:
            await self._fetch_object(req, req.model_object, want, dest)
            return
        assert req.model_url is not None
        if want is None:
            raise BadRequest("model_url needs model_sha256 (64 hex digits)")
        try:
            got = await asyncio.to_thread(self._fetch_url, req.model_url, req.tenant, dest)
        except FetchError as exc:
            raise BadRequest(str(exc)) from None
        if got != want:
            # The expected sha alone: the file's would hand a tenant a digest of what it
            # cannot otherwise read (the review read another tenant's model this way).
            raise BadRequest(f"sha256 mismatch for {req.model_url}: expected {want}")

    async def _fetch_object(
        self, req: CompileRequest, name: str, want: str | None, dest: Path
    ) -> None:
        assert self._store is not None
        # Tenants share the bucket; a request may only name its own tenant's inputs.
        prefix = f"inputs/{req.tenant}/"  # see seedance.events.graph.input_object_name
        if not name.startswith(prefix):
            raise BadRequest(f"model_object {name!r} is not under {prefix!r}")
        try:
            info = await self._store.get_info(name)
        except nats.js.errors.ObjectNotFoundError:
            raise BadRequest(
                f"no object {name!r} in object store {self._settings.object_store!r}"
            ) from None
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
            raise RetryableError(f"object store unavailable: {exc!r}") from exc
        stored = _digest_hex(info.digest or "")
        if want is not None and stored != want:
            raise BadRequest(f"sha256 mismatch for {name}: expected {want}, stored {stored}")
        try:
            with dest.open("wb") as f:
                # writeinto: nats-py otherwise concatenates chunks into one growing bytes object.
                await self._store.get(name, writeinto=f)
        except nats.js.errors.DigestMismatchError:
            raise BadRequest(f"object {name!r} does not match its stored digest") from None
        except nats.errors.TimeoutError as exc:
            raise RetryableError(f"object store read timed out: {exc!r}") from exc

    def _fetch_url(self, url: str, tenant: str, dest: Path) -> str:
        """Copy ``url`` to ``dest`` (in a thread) and return its sha256."""
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("", "file"):
            return self._fetcher.fetch(url, dest)
        src = self._local_path(parsed.path if parsed.scheme else url, tenant)
        limit = int(self._settings.max_model_mib * _MIB)
        h = hashlib.sha256()
        size = 0
        try:
            src_f = src.open("rb")
        except OSError:
            raise _no_model_file(url, tenant) from None
        with src_f, dest.open("wb") as out:
            while chunk := src_f.read(_MIB):
                size += len(chunk)
                if size > limit:
                    raise BadRequest(f"model at {url} exceeds {self._settings.max_model_mib} MiB")
                h.update(chunk)
                out.write(chunk)
        return h.hexdigest()

    def _local_path(self, path: str, tenant: str) -> Path:
        """``path`` if it is a file under ``model_dir/<tenant>/`` (the request subject's
        tenant), as ``model_object`` must lie under ``inputs/<tenant>/``."""
        if not self._settings.model_dir:
            raise BadRequest("local model paths are not enabled on this compiler (model_dir)")
        outside = BadRequest(f"model path {path!r} is outside the compiler's model_dir/{tenant}/")
        root = (Path(self._settings.model_dir).resolve() / tenant).resolve()
        # Judged by its text first, so a path outside model_dir/<tenant> is refused before
        # anything outside is looked at (against model_dir as written too: it may be a symlink
        # itself); then resolved, so a symlink inside cannot lead out.
        written = Path(os.path.normpath(os.path.abspath(self._settings.model_dir))) / tenant
        text = Path(os.path.normpath(os.path.abspath(path)))
        if not (text.is_relative_to(root) or text.is_relative_to(written)):
            raise outside
        p = Path(path).resolve()
        if not p.is_relative_to(root):
            raise outside
        if not p.is_file():
            raise _no_model_file(path, tenant)  # missing and not-a-file read alike
        return p

    # --- compiling --------------------------------------------------------------------------

    async def _compile(
        self, d: Delivery[CompileRequest], model_path: Path, out_path: Path, policy: Any
    ) -> worker.Outcome:
        if self._pool is None:
            self._pool = pool.new_pool(self._settings.compile_memory_mib)
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(
            self._pool,
            worker.compile_file,
            str(model_path),
            str(out_path),
            policy,
            d.event.target,
            self._settings.select_runs,
            self._settings.run_timeout_s,
            self._settings.max_nodes,
            self._settings.compile_run_budget_s,
        )
        try:
            return await asyncio.wait_for(fut, self._settings.compile_timeout_s)
        except TimeoutError:
            # A running task cannot be cancelled in a pool: the child is killed instead.
            self._restart_pool()
            return worker.Outcome(
                error_kind="CompileTimeout",
                error=f"compile ran past {self._settings.compile_timeout_s:g} s and was stopped",
            )
        except BrokenProcessPool as exc:
            # The child died (out of memory, a crash in a native library): try again on a
            # fresh one until the consumer's last delivery, then answer with the reason.
            self._restart_pool()
            if d.num_delivered >= self._max_deliver:
                return worker.Outcome(
                    error_kind="CompilerCrashed",
                    error=f"the compile process died on {d.num_delivered} attempts: {exc}",
                )
            raise RetryableError(f"compile process died: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _heartbeat(self, d: Delivery[Any]) -> AsyncIterator[None]:
        async def beat() -> None:
            while True:
                await self._clock.sleep(self._settings.heartbeat_s)
                with contextlib.suppress(nats.errors.Error):
                    await d.in_progress()
                    self.metrics.heartbeats_total.inc()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            await cancel_until_done([task])  # it publishes: one cancel can be lost

    def _restart_pool(self) -> None:
        if self._pool is not None:
            pool.kill_pool(self._pool)
        self._pool = pool.new_pool(self._settings.compile_memory_mib)

    # --- storing ----------------------------------------------------------------------------

    async def _dead_letter(self, d: Delivery[CompileRequest], reason: str) -> None:
        """The request whose upload is bad, with the reason, on ``seedance.dlq.graph-compiler``
        (its answer goes to the tenant's result subject as well)."""
        letter = DeadLetter(
            id=bad_upload_id(d.event.tenant, d.event.request_id, key=self._id_key),
            at=self._clock.now(),
            service="graph-compiler",
            subject=d.subject,
            stream_seq=d.stream_seq,
            num_delivered=d.num_delivered,
            error_kind="InvalidUpload",
            reason=reason,
            payload=msgspec.json.encode(d.event),
        )
        await self._rt.bus.publish(dlq.subject("graph-compiler"), letter)
        log.warning("compile_upload_refused", tenant=d.event.tenant, reason=reason)

    async def _store_artifact(self, req: CompileRequest, path: Path, size: int) -> dict[str, Any]:
        assert self._store is not None
        if req.model_chunks and size <= self._settings.max_inline_artifact_mib * _MIB:
            # A tenant's answer: it can read its own artifact subjects, not the object store.
            n = await uploads.publish_artifact(
                self._rt.bus, tenant=req.tenant, request_id=req.request_id, path=path,
                key=self._id_key,
            )  # fmt: skip
            return {"artifact_chunks": n}
        if size <= self._settings.max_inline_artifact_mib * _MIB:
            name = artifact_object_name(req.tenant, req.request_id, req.model_name)
            with path.open("rb") as f:
                await self._store.put(name, f)
            return {"artifact_object": name}
        if not self._settings.artifact_dir:
            raise BadRequest(
                f"artifact is {size / _MIB:.1f} MiB, over the inline limit of "
                f"{self._settings.max_inline_artifact_mib:g} MiB, and no artifact_dir is set"
            )
        name = f"{req.model_name}.onnx"
        dest = Path(self._settings.artifact_dir, req.tenant, req.request_id, name)
        return {"artifact_url": await asyncio.to_thread(_move, path, dest)}


def _move(src: Path, dest: Path) -> str:
    """Copy ``src`` to ``dest`` and return its file URL."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Written next to the destination then renamed: a reader never sees half an artifact.
    partial = dest.with_suffix(".partial")
    shutil.copyfile(src, partial)
    partial.replace(dest)
    return dest.resolve().as_uri()


def _check_sha256(value: str) -> str:
    v = value.strip().lower()
    if len(v) != 64 or not set(v) <= _SHA256_HEX:
        raise BadRequest(f"model_sha256 must be 64 hex digits, got {value!r}")
    return v


def _no_model_file(path: str, tenant: str) -> BadRequest:
    return BadRequest(f"no model file at {path!r} under the compiler's model_dir/{tenant}/")


def _digest_hex(digest: str) -> str:
    """``SHA-256=<base64url>`` (the object store's form) → hex."""
    _, _, b64 = digest.partition("=")
    try:
        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except (binascii.Error, ValueError):
        return ""
