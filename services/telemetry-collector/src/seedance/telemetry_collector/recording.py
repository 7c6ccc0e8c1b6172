"""Recorded NVML: capture real call sequences and return codes, and serve them back.

Owns the recording format and the two stand-ins for ``PynvmlApi``: ``RecordingNvmlApi`` wraps
the real one and writes down every call (function, arguments, result or NVML return code), and
``ReplayNvmlApi`` answers the same calls from such a file, so the MIG, NVLink and XID paths can
be exercised without that hardware. It must not interpret what it records.

Format (JSON)::

    {"format": "seedance-nvml-recording/1",
     "provenance": "recorded" | "constructed",
     "description": "...",
     "calls": [{"fn": "nvmlDeviceGetPowerUsage", "args": ["gpu0"], "ok": 81234},
               {"fn": "nvmlDeviceGetNvLinkState", "args": ["gpu0", 0], "err": 3}, ...]}

Handles (devices, MIG devices, event sets, GPM samples) are written as stable tokens
("gpu0", "gpu0/mig1", "eventset0", "gpmsample0"); ctypes structs become objects of their fields.

Replay is keyed by (function, arguments): each key serves its recorded results in order and
then keeps serving the last one, so a poller can run longer than the recording. A call that
was never recorded raises ``NVMLError_NotSupported`` (the default, which is what NVML answers
for a field a GPU lacks) or, with ``strict=True``, ``ReplayMissError``.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections import defaultdict, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = [
    "RECORDING_FORMAT",
    "RecordingNvmlApi",
    "ReplayMissError",
    "ReplayNvmlApi",
    "load_recording",
]

RECORDING_FORMAT = "seedance-nvml-recording/1"

# Functions whose result is an opaque handle, and the token prefix it is recorded under.
_HANDLE_RESULTS = {
    "nvmlDeviceGetHandleByIndex": "gpu",
    "nvmlDeviceGetMigDeviceHandleByIndex": "mig",
    "nvmlEventSetCreate": "eventset",
    "nvmlGpmSampleAlloc": "gpmsample",
}
# Functions that fill a handle in place: the recorded result is the handle's token.
_RETURNS_ARG = {"nvmlGpmSampleGet": 1}


class ReplayMissError(LookupError):
    """A strict replay was asked for a call that the recording does not hold."""


def _plain(value: Any) -> Any:
    """A ctypes struct, pynvml friendly object, bytes or list as JSON-able data."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        out = {}
        for name, *_ in value._fields_:
            attr = getattr(value, name)
            # Pointers inside structs (e.g. an event's device handle) cannot be replayed.
            out[name] = None if isinstance(attr, ctypes._Pointer) else _plain(attr)
        return out
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def _revive(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _revive(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_revive(v) for v in value]
    return value


class RecordingNvmlApi:
    """Wraps a real NVML api (``PynvmlApi``) and records every call made through it."""

    def __init__(self, inner: Any, *, description: str = "") -> None:
        self._inner = inner
        self._description = description
        self._calls: list[dict[str, Any]] = []
        self._object_of: dict[str, Any] = {}
        self._counters: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def _tokenise(self, fn: str, args: tuple[Any, ...], result: Any) -> str:
        prefix = _HANDLE_RESULTS[fn]
        if fn == "nvmlDeviceGetHandleByIndex":
            token = f"gpu{args[0]}"
        elif fn == "nvmlDeviceGetMigDeviceHandleByIndex":
            token = f"{self._arg_token(args[0])}/mig{args[1]}"
        else:
            token = f"{prefix}{self._counters[prefix]}"
            self._counters[prefix] += 1
        self._object_of[token] = result
        return token

    def _arg_token(self, arg: Any) -> Any:
        if isinstance(arg, str) and arg in self._object_of:
            return arg
        return _plain(arg)

    def __getattr__(self, fn: str) -> Any:
        target = getattr(self._inner, fn)
        if not callable(target):
            return target

        def call(*args: Any) -> Any:
            real_args = tuple(self._object_of.get(a, a) if isinstance(a, str) else a for a in args)
            entry: dict[str, Any] = {"fn": fn, "args": [self._arg_token(a) for a in args]}
            try:
                result = target(*real_args)
            except pynvml.NVMLError as exc:
                entry["err"] = exc.value
                with self._lock:
                    self._calls.append(entry)
                raise
            if fn in _HANDLE_RESULTS:
                with self._lock:
                    token = self._tokenise(fn, args, result)
                entry["ok"] = token
                out: Any = token
            elif fn in _RETURNS_ARG:
                entry["ok"] = args[_RETURNS_ARG[fn]]
                out = args[_RETURNS_ARG[fn]]
            else:
                entry["ok"] = _plain(result)
                out = result
            with self._lock:
                self._calls.append(entry)
            return out

        return call

    def recording(self) -> dict[str, Any]:
        with self._lock:
            calls = list(self._calls)
        return {
            "format": RECORDING_FORMAT,
            "provenance": "recorded",
            "description": self._description,
            "calls": calls,
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.recording(), indent=None, separators=(",", ":")) + "\n")


def load_recording(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recording is a JSON object, got {type(data).__name__}")
    if data.get("format") != RECORDING_FORMAT:
        raise ValueError(f"{path}: format is {data.get('format')!r}, expected {RECORDING_FORMAT!r}")
    return data


class ReplayNvmlApi:
    """Serves a recording through the same pynvml-shaped calls (see the module doc)."""

    def __init__(self, recording: dict[str, Any], *, strict: bool = False) -> None:
        if recording.get("format") != RECORDING_FORMAT:
            raise ValueError(f"recording format is {recording.get('format')!r}")
        self.provenance: str = recording.get("provenance", "unknown")
        self._strict = strict
        self._queues: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        for entry in recording["calls"]:
            self._queues[self._key(entry["fn"], entry["args"])].append(entry)
        self._lock = threading.Lock()
        self.calls: list[str] = []

    @staticmethod
    def _key(fn: str, args: Any) -> str:
        return json.dumps([fn, list(args)], separators=(",", ":"))

    def push(self, fn: str, args: list[Any], *, ok: Any = None, err: int | None = None) -> None:
        """Queue a result ahead of the replay's own (for tests: a GPU lost mid-run, an XID)."""
        entry: dict[str, Any] = {"fn": fn, "args": args}
        if err is not None:
            entry["err"] = err
        else:
            entry["ok"] = ok
        with self._lock:
            # Served first; the key's own last result stays sticky behind it.
            self._queues[self._key(fn, args)].appendleft(entry)

    def __getattr__(self, fn: str) -> Any:
        if not fn.startswith("nvml"):
            raise AttributeError(fn)

        def call(*args: Any) -> Any:
            key = self._key(fn, [_plain(a) for a in args])
            with self._lock:
                self.calls.append(fn)
                q = self._queues.get(key)
                if not q:
                    if self._strict:
                        raise ReplayMissError(key)
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                entry = q.popleft() if len(q) > 1 else q[0]
            if "err" in entry:
                raise pynvml.NVMLError(entry["err"])
            return _revive(entry["ok"])

        return call
