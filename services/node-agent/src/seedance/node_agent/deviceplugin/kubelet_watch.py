"""Registration that survives the kubelet: watch its socket and the plugins', register again.

Owns keeping every plugin registered with the kubelet there is now. A kubelet that restarts
deletes every socket in its device-plugin directory (the plugins' included) and re-creates
``kubelet.sock``; it then knows no plugin until each registers again, so a plugin that does not
notice never advertises its devices to it (NVIDIA's k8s-device-plugin restarts its plugins on
fsnotify's Create of ``kubelet.sock`` for that reason). ``KubeletWatch.check`` compares the
kubelet socket's identity (below) with the one each plugin last registered with,
and each plugin's own socket with the one it last served on; on a difference it restarts that
plugin's gRPC server on a fresh socket and registers it again, retrying with backoff while the
kubelet refuses or does not answer. While ``kubelet.sock`` is absent it only waits.

Polled, not inotify: inotify is not in the standard library and no inotify package is a
dependency of this workspace; two or three ``stat`` calls a second cost microseconds and see
what an ``IN_CREATE`` would, one poll interval later. A re-created socket shows as a new
identity at the same path: ``(st_dev, st_ino, st_ctime_ns)``, the change time included because
a file system may hand a freed inode number straight back (ext4 does); a socket that exists
throughout (the kubelet never restarted) keeps all three. And the kubelet's restart deletes
the plugins' sockets too, which is noticed on its own.

It must not change devices or grants: the plugins keep their inventory and their allocate
callback (with what it granted) across a restart; it decides only when to serve and register.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from enum import StrEnum

import grpc
import structlog

from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.retry import RetryPolicy
from seedance.node_agent.deviceplugin.server import DevicePluginServer

__all__ = ["KubeletWatch", "Registration", "socket_identity"]

_log = structlog.get_logger(__name__)

#: ``(st_dev, st_ino, st_ctime_ns)`` of a socket file: a re-created socket has a new one.
SocketIdentity = tuple[int, int, int]


def socket_identity(path: str) -> SocketIdentity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Registration(StrEnum):
    """Why a plugin registered (a metric label: a closed set)."""

    START = "start"  # never registered with any kubelet yet
    KUBELET_RESTARTED = "kubelet_restarted"  # kubelet.sock is a new socket
    SOCKET_REMOVED = "socket_removed"  # the plugin's own socket was deleted or replaced


@dataclasses.dataclass
class _PluginState:
    kubelet: SocketIdentity | None = None  # the kubelet socket it last registered with
    served: SocketIdentity | None = None  # its own socket, as last served
    served_for: SocketIdentity | None = None  # the kubelet socket there when it was served
    failures: int = 0
    retrying: Registration | None = None  # why the last attempt was made, while it failed
    retry_at: float = 0.0


class KubeletWatch:
    """Keeps ``plugins`` registered with the kubelet on ``kubelet_socket``.

    ``check()`` is one look (the node agent calls it once at start, so start registers when the
    kubelet is there); ``run()`` checks every ``poll_interval_s`` until cancelled.
    ``on_registered(resource, why)`` and ``on_failed(resource)`` feed the caller's metrics.
    """

    def __init__(
        self,
        plugins: Sequence[DevicePluginServer],
        kubelet_socket: str,
        *,
        poll_interval_s: float = 1.0,
        backoff: RetryPolicy | None = None,
        register_timeout_s: float = 5.0,
        on_registered: Callable[[str, Registration], None] | None = None,
        on_failed: Callable[[str], None] | None = None,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s = {poll_interval_s}: must be above 0")
        self._plugins = plugins
        self._kubelet_socket = kubelet_socket
        self._poll_interval_s = poll_interval_s
        # From one poll up to 30 s: a kubelet that refuses (a version it does not serve) is
        # asked again without flooding its log.
        self._backoff = backoff or RetryPolicy(initial_s=poll_interval_s, max_s=30.0)
        self._register_timeout_s = register_timeout_s
        self._on_registered = on_registered
        self._on_failed = on_failed
        self._clock = clock
        self._state: dict[str, _PluginState] = {}
        #: Whether the last check found ``kubelet.sock`` (False while the kubelet is away).
        self.kubelet_present = False

    async def run(self) -> None:
        while True:
            await self.check()
            await self._clock.sleep(self._poll_interval_s)

    async def check(self) -> None:
        kubelet = socket_identity(self._kubelet_socket)
        if kubelet is None:
            if self.kubelet_present:
                _log.warning("kubelet_socket_absent", socket=self._kubelet_socket)
            self.kubelet_present = False
            return  # nothing to register with; the plugins' sockets are re-made when it is back
        self.kubelet_present = True
        for plugin in self._plugins:
            await self._keep_registered(plugin, kubelet)

    async def _keep_registered(self, plugin: DevicePluginServer, kubelet: SocketIdentity) -> None:
        state = self._state.setdefault(plugin.resource_name, _PluginState())
        served = socket_identity(plugin.socket_path)
        if state.served is None and state.kubelet is None:
            # The first look: the socket the plugin was started on is adopted (the kubelet
            # deletes sockets before it creates its own, so one still there is newer than it).
            state.served, state.served_for = served, kubelet
        why = _needs_registration(state, served, kubelet)
        if why is None or self._clock.monotonic() < state.retry_at:
            return
        try:
            if served is None or served != state.served or state.served_for != kubelet:
                # A fresh socket for this kubelet (the one that deleted the old socket dials
                # this path); a retry after a refusal keeps the socket it already made.
                await plugin.restart()
            state.served = socket_identity(plugin.socket_path)
            state.served_for = kubelet
            await plugin.register(self._kubelet_socket, timeout_s=self._register_timeout_s)
        except (grpc.aio.AioRpcError, OSError, RuntimeError) as exc:
            # Retryable, all of them: the kubelet not answering yet, refusing while it starts,
            # or the socket path briefly unusable (grpc raises RuntimeError when it cannot bind).
            self._failed(plugin.resource_name, state, why, exc)
            return
        state.kubelet, state.failures, state.retry_at, state.retrying = kubelet, 0, 0.0, None
        if why is not Registration.START:
            _log.info(
                "device_plugin_reregistered",
                resource=plugin.resource_name,
                reason=why.value,
                socket=plugin.socket_path,
            )
        if self._on_registered is not None:
            self._on_registered(plugin.resource_name, why)

    def _failed(
        self, resource: str, state: _PluginState, why: Registration, exc: BaseException
    ) -> None:
        state.failures += 1
        state.retrying = why
        delay_s = self._backoff.delay_s(state.failures)
        state.retry_at = self._clock.monotonic() + delay_s
        _log.warning(
            "device_plugin_register_failed",
            resource=resource,
            reason=why.value,
            attempt=state.failures,
            retry_in_s=round(delay_s, 2),
            error=_describe(exc),
        )
        if self._on_failed is not None:
            self._on_failed(resource)


def _needs_registration(
    state: _PluginState, served: SocketIdentity | None, kubelet: SocketIdentity
) -> Registration | None:
    """Why the plugin must register now; None when it is registered with this kubelet and
    serves on the socket that kubelet knows."""
    if state.kubelet is None:
        return Registration.START
    if state.kubelet != kubelet:
        return Registration.KUBELET_RESTARTED
    if served is None or served != state.served:
        return Registration.SOCKET_REMOVED
    return state.retrying  # a registration with this kubelet on this socket that failed


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return repr(exc)
