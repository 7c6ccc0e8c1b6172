"""Bounded model fetches by URL: which URLs the compiler may open, and how much it reads.

A ``model_url`` comes from a tenant, and the compiler runs inside the operator's network, so
without bounds a request could make it read the metrics port, a cloud metadata address or a
neighbour's admin page and tell the tenant what it found (its hash, its size, whether it
parses). Owns, for http and https:

* the allow-list: the URL's scheme and host, then every address the host resolves to; loopback,
  link-local, private, unspecified, multicast and reserved addresses are refused unless one of
  the configured networks holds them;
* the connection to an address that was checked (the host is resolved once, so a DNS answer
  that changes between the check and the connect, as in DNS rebinding, cannot move it);
* redirects, each checked as the URL it replaces;
* the size limit (from Content-Length before the body, and while streaming) and one deadline
  for the whole fetch, and the sha256 of exactly the bytes written.

Must not know about the bus or the request's event; the service maps ``FetchError`` to its
``InvalidRequest`` answer. Local paths (``model_dir``) are the service's, not this module's.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedance.core.clock import Clock

__all__ = ["FetchError", "FetchPolicy", "UrlFetcher", "address_refusal"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

#: Schemes this module can fetch; the settings choose a subset.
FETCHABLE_SCHEMES = frozenset({"http", "https"})
# Model hosts (object stores, release pages) redirect to a CDN once or twice; more is a loop.
_MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1024**2
_MIB = 1024**2


class FetchError(Exception):
    """The URL is refused or cannot be fetched within the limits; not retryable: the same
    request meets the same policy. The message names the URL and the reason."""


@dataclass(frozen=True, kw_only=True)
class FetchPolicy:
    schemes: frozenset[str]
    #: Exact host names, or ``*.example.com`` for any name under it; empty: any host.
    hosts: tuple[str, ...]
    #: Networks fetched from although they are not public (an in-cluster model server).
    allow_networks: tuple[IPNetwork, ...]
    max_bytes: int
    timeout_s: float

    @classmethod
    def parse(
        cls,
        *,
        schemes: str,
        hosts: str,
        allow_networks: str,
        max_model_mib: float,
        timeout_s: float,
    ) -> FetchPolicy:
        """The policy from the settings' comma-separated strings; ValueError names the setting
        and the value that is wrong."""
        scheme_set = frozenset(s.lower() for s in _items(schemes))
        if not scheme_set <= FETCHABLE_SCHEMES:
            unknown = ", ".join(sorted(scheme_set - FETCHABLE_SCHEMES))
            raise ValueError(f"url_schemes: {unknown!r} is not one of http, https")
        host_list = tuple(h.lower() for h in _items(hosts))
        for h in host_list:
            name = h.removeprefix("*.")
            if not name or any(c in name for c in "*/@ "):
                raise ValueError(f"url_hosts: {h!r} is not a host name or *.domain")
        networks: list[IPNetwork] = []
        for n in _items(allow_networks):
            try:
                networks.append(ipaddress.ip_network(n, strict=False))
            except ValueError as exc:
                raise ValueError(f"url_allow_networks: {n!r} is not a network ({exc})") from None
        if not max_model_mib > 0:
            raise ValueError(f"max_model_mib must be > 0, got {max_model_mib!r}")
        if not timeout_s > 0:
            raise ValueError(f"fetch_timeout_s must be > 0, got {timeout_s!r}")
        return cls(
            schemes=scheme_set,
            hosts=host_list,
            allow_networks=tuple(networks),
            max_bytes=int(max_model_mib * _MIB),
            timeout_s=timeout_s,
        )

    def host_allowed(self, host: str) -> bool:
        if not self.hosts:
            return True
        host = host.lower().rstrip(".")
        return any(host.endswith(h[1:]) if h.startswith("*.") else host == h for h in self.hosts)


def address_refusal(address: IPAddress, allow: Sequence[IPNetwork] = ()) -> str | None:
    """Why ``address`` may not be fetched from, or None when it may."""
    # An IPv4-mapped IPv6 address (::ffff:127.0.0.1) reaches the IPv4 host: judge that one.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in n for n in allow if n.version == address.version):
        return None
    # Named in order of how specific they are: 169.254.169.254 is private too, but "link-local"
    # is what tells the operator which setting to look at.
    for name, hit in (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if hit:
            return name
    if not address.is_global:  # e.g. 100.64.0.0/10, carrier-grade NAT
        return "not globally routable"
    return None


class UrlFetcher:
    """Copies a URL's body to a file under a ``FetchPolicy``; blocking (run it in a thread).

    ``clock`` measures the deadline (its ``monotonic``); ``resolve`` is ``socket.getaddrinfo``
    unless a test gives another.
    """

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        clock: Clock,
        resolve: Resolver = socket.getaddrinfo,
    ) -> None:
        self._policy = policy
        self._resolve = resolve
        self._monotonic = clock.monotonic

    def fetch(self, url: str, dest: Path) -> str:
        """Write the body of ``url`` to ``dest`` and return the sha256 (hex) of what was
        written; FetchError names the URL and the reason."""
        deadline = self._monotonic() + self._policy.timeout_s
        current = url
        for _ in range(_MAX_REDIRECTS + 1):
            target = self._check(current)
            location, digest = self._get(current, target, dest, deadline)
            if location is None:
                return digest
            current = urllib.parse.urljoin(current, location)
        raise FetchError(f"model_url {url!r}: more than {_MAX_REDIRECTS} redirects")

    # --- the allow-list ---------------------------------------------------------------------

    def _check(self, url: str) -> _Target:
        scheme, host, port = self._allowed_url(url)
        addresses = self._addresses(url, host, port)
        return _Target(scheme=scheme, host=host, port=port, addresses=addresses)

    def _allowed_url(self, url: str) -> tuple[str, str, int]:
        """The URL's scheme, host and port, once the scheme and host are allowed."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise _refuse(url, f"not a valid URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in self._policy.schemes:
            allowed = ", ".join(sorted(self._policy.schemes)) or "none"
            raise _refuse(url, f"scheme {scheme!r} is not allowed (allowed: {allowed})")
        host = parts.hostname
        if not host:
            raise _refuse(url, "no host")
        if parts.username is not None or parts.password is not None:
            # They would be dropped (no basic auth here) and they end up in logs and errors.
            raise _refuse(url, "credentials in the URL are not supported")
        if not self._policy.host_allowed(host):
            raise _refuse(url, f"host {host!r} is not in url_hosts")
        return scheme, host, port or (443 if scheme == "https" else 80)

    def _addresses(self, url: str, host: str, port: int) -> tuple[IPAddress, ...]:
        """Every address ``host`` resolves to, once each is allowed."""
        try:
            infos = self._resolve(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise _refuse(url, f"host {host!r} does not resolve ({exc})") from None
        addresses: list[IPAddress] = []
        for info in infos:
            raw = str(info[4][0])
            address = ipaddress.ip_address(raw)
            # Every answer is checked: a host with one public and one private address is
            # refused, since the connection could go to either.
            reason = address_refusal(address, self._policy.allow_networks)
            if reason is not None:
                raise _refuse(url, f"{host!r} resolves to {raw} ({reason}; see url_allow_networks)")
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise _refuse(url, f"host {host!r} has no address")
        return tuple(addresses)

    # --- one request ------------------------------------------------------------------------

    def _get(
        self, url: str, target: _Target, dest: Path, deadline: float
    ) -> tuple[str | None, str]:
        """GET ``url`` from one of ``target``'s checked addresses: (None, the sha256) once
        the body is in ``dest``, or (a redirect's Location, "")."""
        conn = _PinnedConnection(target, self._remaining(url, deadline))
        try:
            parts = urllib.parse.urlsplit(url)
            path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            try:
                conn.request("GET", path, headers={"Accept-Encoding": "identity"})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._raise_late(url, deadline)
                raise FetchError(f"cannot fetch {url!r}: {_describe(exc)}") from None
            if resp.status in _REDIRECTS:
                location = resp.getheader("Location")
                if not location:
                    raise FetchError(f"cannot fetch {url!r}: HTTP {resp.status} without Location")
                return location, ""
            if resp.status != 200:
                raise FetchError(f"cannot fetch {url!r}: HTTP {resp.status} {resp.reason}")
            return None, self._stream(url, resp, conn, dest, deadline)
        finally:
            conn.close()

    def _stream(
        self,
        url: str,
        resp: http.client.HTTPResponse,
        conn: _PinnedConnection,
        dest: Path,
        deadline: float,
    ) -> str:
        limit = self._policy.max_bytes
        limit_text = f"over the limit of {limit / _MIB:g} MiB (max_model_mib)"
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise FetchError(f"model at {url!r} is {int(length)} bytes, {limit_text}")
        h = hashlib.sha256()
        size = 0
        with dest.open("wb") as out:
            while True:
                # Each read waits at most until the deadline: a server dripping a byte at a
                # time cannot stretch the fetch past it.
                conn.set_timeout(self._remaining(url, deadline))
                try:
                    # read1: what one receive brings, not a loop until a whole chunk arrived.
                    chunk = resp.read1(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    self._raise_late(url, deadline)
                    raise FetchError(f"cannot fetch {url!r}: {_describe(exc)}") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise FetchError(f"model at {url!r} is {limit_text}")
                h.update(chunk)
                out.write(chunk)
        return h.hexdigest()

    def _remaining(self, url: str, deadline: float) -> float:
        left = deadline - self._monotonic()
        if left <= 0:
            raise self._late(url)
        return left

    def _raise_late(self, url: str, deadline: float) -> None:
        if self._monotonic() >= deadline:
            raise self._late(url) from None

    def _late(self, url: str) -> FetchError:
        return FetchError(
            f"fetching {url!r} did not finish within {self._policy.timeout_s:g} s (fetch_timeout_s)"
        )


@dataclass(frozen=True, kw_only=True)
class _Target:
    scheme: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to ``target``'s host that connects only to its checked addresses.

    The Host header and TLS (SNI and certificate checks) use the host name, as a normal client
    would; only the address is fixed. Proxies (``HTTP(S)_PROXY``) are not used: a proxy would
    resolve the name again and connect where the check never looked.
    """

    def __init__(self, target: _Target, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self._target = target

    def connect(self) -> None:
        last: OSError | None = None
        for address in self._target.addresses:
            try:
                sock = socket.create_connection((str(address), self.port), self.timeout)
                break
            except OSError as exc:
                last = exc
        else:
            assert last is not None
            raise last
        if self._target.scheme == "https":
            # The system's CAs (SSL_CERT_FILE / SSL_CERT_DIR apply), checked against the name.
            context = ssl.create_default_context()
            sock = context.wrap_socket(sock, server_hostname=self._target.host)
        self.sock = sock

    def set_timeout(self, timeout_s: float) -> None:
        if self.sock is not None:
            self.sock.settimeout(timeout_s)


def _refuse(url: str, reason: str) -> FetchError:
    return FetchError(f"model_url {url!r} refused: {reason}")


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
