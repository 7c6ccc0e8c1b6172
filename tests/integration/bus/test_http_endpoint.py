"""Where a service's ``/metrics`` binds: loopback unless its settings say otherwise, on the port
they name (0: any free one, said by ``http_url`` and the ``http_listening`` log line)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from seedance.core import BusSettings, ServiceRuntime


async def get(host: str, port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    body = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    await writer.wait_closed()
    return body.decode()


@pytest.mark.parametrize(("host", "listening"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
async def test_metrics_bind_where_the_settings_say(
    nats_url: str, unique: str, host: str | None, listening: str
) -> None:
    where = {} if host is None else {"http_host": host}
    runtime = ServiceRuntime(f"bind{unique}", BusSettings(url=nats_url), http_port=0, **where)
    assert runtime.http_url() == f"http://{listening}:0/metrics"  # before start: as configured
    await runtime.start()
    try:
        url = urlsplit(runtime.http_url())
        assert url.hostname == listening
        assert url.port
        assert url.port == runtime.http_port
        text = await get("127.0.0.1", url.port, url.path)
        assert text.startswith("HTTP/1.1 200 OK")
        assert f"seedance_bind{unique}_messages_total" in text
    finally:
        await runtime.close()
