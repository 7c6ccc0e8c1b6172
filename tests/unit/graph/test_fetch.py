"""The graph-compiler's URL fetch policy: addresses, hosts, schemes, settings, and connecting to
the address that was checked (against a real local HTTP(S) server)."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from seedance.core.clock import WallClock
from seedance.core.settings import SettingsError, load_settings
from seedance.graph_compiler.fetch import FetchError, FetchPolicy, UrlFetcher, address_refusal
from seedance.graph_compiler.settings import GraphCompilerSettings
from tests.integration.graph.model_server import ModelServer, Route, serve_models


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: reaches the IPv4 loopback
        ("169.254.169.254", "link-local"),  # the cloud metadata address
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not globally routable"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
    ],
)
def test_address_refusals(address: str, reason: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(address)) == reason


def test_allowed_networks_open_only_themselves() -> None:
    allow = [ipaddress.ip_network("10.0.0.0/8")]
    assert address_refusal(ipaddress.ip_address("10.9.9.9"), allow) is None
    assert address_refusal(ipaddress.ip_address("192.168.0.1"), allow) == "private"
    assert address_refusal(ipaddress.ip_address("::ffff:10.0.0.1"), allow) is None


def _policy(**kw: Any) -> FetchPolicy:
    fields: dict[str, Any] = {
        "schemes": "http,https",
        "hosts": "",
        "allow_networks": "",
        "max_model_mib": 1.0,
        "timeout_s": 10.0,
    }
    return FetchPolicy.parse(**(fields | kw))


def _unresolvable(*args: Any, **kw: Any) -> list[Any]:
    raise AssertionError(f"resolved {args!r}: the URL should have been refused before")


@pytest.mark.parametrize(
    ("url", "policy", "reason"),
    [
        ("ftp://example.com/m.onnx", {}, "scheme 'ftp' is not allowed (allowed: http, https)"),
        ("http://example.com/m.onnx", {"schemes": "https"}, "scheme 'http' is not allowed"),
        ("https://evil.example.org/m", {"hosts": "*.example.com"}, "not in url_hosts"),
        ("https://example.com/m", {"hosts": "*.example.com"}, "not in url_hosts"),
        ("https://u:p@models.example.com/m", {}, "credentials in the URL"),
        ("https:///m.onnx", {}, "no host"),
        ("http://[::1/m", {}, "not a valid URL"),
    ],
)
def test_refused_before_any_lookup(
    url: str, policy: dict[str, Any], reason: str, tmp_path: Path
) -> None:
    fetcher = UrlFetcher(_policy(**policy), clock=WallClock(), resolve=_unresolvable)
    with pytest.raises(FetchError) as err:
        fetcher.fetch(url, tmp_path / "m")
    assert str(err.value).startswith(f"model_url {url!r} refused: ")
    assert reason in str(err.value)
    assert not (tmp_path / "m").exists()


def test_host_patterns() -> None:
    policy = _policy(hosts="models.example.com, *.cdn.example.net")
    assert policy.host_allowed("models.example.com")
    assert policy.host_allowed("MODELS.example.com.")
    assert policy.host_allowed("eu.cdn.example.net")
    assert not policy.host_allowed("cdn.example.net")
    assert not policy.host_allowed("models.example.com.evil.org")
    assert not policy.host_allowed("xmodels.example.com")


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("URL_SCHEMES", "https,gopher", "url_schemes: 'gopher'"),
        ("URL_ALLOW_NETWORKS", "10.0.0.0/8,not-a-net", "url_allow_networks: 'not-a-net'"),
        ("URL_HOSTS", "*", "url_hosts: '*'"),
        ("MAX_MODEL_MIB", "0", "max_model_mib must be > 0, got 0.0"),
        ("FETCH_TIMEOUT_S", "-1", "fetch_timeout_s must be > 0, got -1.0"),
    ],
)
def test_bad_settings_name_the_setting_and_value(var: str, value: str, named: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(
            GraphCompilerSettings, "graph-compiler", {f"SEEDANCE_GRAPH_COMPILER_{var}": value}
        )
    assert named in str(err.value)


def test_settings_defaults_refuse_private_networks() -> None:
    policy = load_settings(GraphCompilerSettings, "graph-compiler", {}).fetch_policy()
    assert policy.schemes == {"http", "https"}
    assert policy.allow_networks == ()
    assert policy.max_bytes == 2 * 1024**3


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    yield from serve_models()


def test_the_checked_address_is_the_one_connected_to(
    model_server: ModelServer, tmp_path: Path
) -> None:
    """A DNS answer that changes after the check (DNS rebinding) cannot move the connection."""
    body = b"model bytes"
    model_server.routes["/m.onnx"] = Route(body=body)
    answers = iter(["127.0.0.1", "10.9.9.9"])
    asked: list[str] = []

    def rebinding(host: str, port: int, **kw: Any) -> list[Any]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    fetcher = UrlFetcher(
        _policy(allow_networks="127.0.0.1/32"), clock=WallClock(), resolve=rebinding
    )
    url = f"http://rebind.test:{model_server.port}/m.onnx"
    assert fetcher.fetch(url, tmp_path / "m") == hashlib.sha256(body).hexdigest()
    assert (tmp_path / "m").read_bytes() == body
    assert asked == ["rebind.test"]  # resolved once, for the check
    assert [s.host for s in model_server.seen] == [f"rebind.test:{model_server.port}"]


def test_every_resolved_address_is_checked(tmp_path: Path) -> None:
    def mixed(host: str, port: int, **kw: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.168.0.7", port)),
        ]

    with pytest.raises(FetchError) as err:
        UrlFetcher(_policy(), clock=WallClock(), resolve=mixed).fetch(
            "http://two.test/m", tmp_path / "m"
        )
    assert "'two.test' resolves to 192.168.0.7 (private; see url_allow_networks)" in str(err.value)


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    """An https model server whose self-signed certificate names only ``localhost``, trusted
    through SSL_CERT_FILE (which the default TLS context reads)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ModelServer(tls=context)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_https_checks_the_name_on_the_pinned_address(tls_server: ModelServer, tmp_path: Path):
    body = b"weights" * 100
    tls_server.routes["/m.onnx"] = Route(body=body)
    fetcher = UrlFetcher(_policy(allow_networks="127.0.0.0/8,::1/128"), clock=WallClock())
    got = fetcher.fetch(tls_server.url("/m.onnx", "localhost"), tmp_path / "m")
    assert got == hashlib.sha256(body).hexdigest()
    # The same server by address: the certificate does not name 127.0.0.1, so TLS refuses.
    with pytest.raises(FetchError) as err:
        fetcher.fetch(tls_server.url("/m.onnx"), tmp_path / "m")
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)


class _StoppedClock:
    """The injected clock: the deadline is set at 0 s, and every later reading is past it."""

    def __init__(self) -> None:
        self.readings = 0

    def monotonic(self) -> float:
        self.readings += 1
        return 0.0 if self.readings == 1 else 1e9


def test_the_deadline_is_read_from_the_injected_clock(tmp_path: Path) -> None:
    clock = _StoppedClock()
    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80))]
    fetcher = UrlFetcher(_policy(), clock=clock, resolve=lambda *a, **k: public)
    with pytest.raises(FetchError, match="did not finish within 10 s"):
        fetcher.fetch("http://models.test/m.onnx", tmp_path / "m")
    assert clock.readings == 2  # the deadline, then the check before connecting
    assert not (tmp_path / "m").exists()
