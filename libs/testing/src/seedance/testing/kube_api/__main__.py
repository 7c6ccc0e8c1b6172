"""``python -m seedance.testing.kube_api --port 0 --state FILE``: the test API server as a
process. It prints its URL (one line, flushed) once it listens, journals every write to FILE so
that a restarted process continues with the same objects and revision counter, and stops on
SIGTERM/SIGINT. It must hold no logic of its own beyond argument parsing and signal wiring.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from seedance.testing.kube_api.server import KubeApiServer, KubeApiSettings

__all__ = ["main"]


async def _serve(settings: KubeApiSettings) -> None:
    server = KubeApiServer(settings)
    await server.start()
    print(server.url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m seedance.testing.kube_api")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--state", type=Path, default=None, help="journal file (kept across restarts)"
    )
    parser.add_argument("--bookmark-interval-s", type=float, default=3.0)
    parser.add_argument("--history-window", type=int, default=10_000)
    args = parser.parse_args(argv)
    settings = KubeApiSettings(
        host=args.host,
        port=args.port,
        state_path=args.state,
        bookmark_interval_s=args.bookmark_interval_s,
        history_window=args.history_window,
    )
    asyncio.run(_serve(settings))


if __name__ == "__main__":
    main()
