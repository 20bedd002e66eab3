"""`slo-api` / `python -m slo_api`: serve the app with uvicorn, settings from the environment."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from slo_api import __version__
from slo_api.app import create_app
from slo_api.auth import TokenFileError
from slo_api.logs import setup_logging
from slo_api.settings import Settings

log = logging.getLogger("slo_api")

# How often shutdown looks for connections that cannot finish closing.
REAP_SECONDS = 1.0


class Server(uvicorn.Server):
    """On SIGTERM, say 503 on /readyz for a grace period, then stop as uvicorn does:
    stop accepting, let in-flight requests finish, run the lifespan shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_seconds: float) -> None:
        super().__init__(config)
        self.app = app
        self.grace_seconds = grace_seconds
        self._draining = False
        self._received: list[int] = []

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's: its exit handler on SIGINT and SIGTERM while serving, then each
        signal raised again, except a SIGTERM, which drained cleanly: a normal stop, so the
        process exits 0 instead of dying by the signal."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach only the main thread
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        for received in reversed(self._received):
            if received != signal.SIGTERM:
                signal.raise_signal(received)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._received.append(sig)
        runtime = getattr(self.app.state, "runtime", None)
        if runtime is not None:
            runtime.shutting_down = True
        if sig == signal.SIGTERM and self.grace_seconds > 0 and not self._draining:
            self._draining = True
            log.info("SIGTERM: not ready; stopping in %gs", self.grace_seconds)
            timer = threading.Timer(self.grace_seconds, self._stop, (sig, frame))
            timer.daemon = True
            timer.start()
            return
        self._stop(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        reaper = asyncio.create_task(self._reap_stuck())
        try:
            await super().shutdown(sockets)
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    async def _reap_stuck(self) -> None:
        """Abort connections whose response is over but whose client stopped reading.

        A closed transport keeps its socket until the bytes it buffered are read, so a
        stalled client (a change stream's, cut by the feed) would hold the shutdown until
        uvicorn's graceful timeout. Only closing transports are aborted, after a second
        look: a request still being served is never cut here.
        """
        seen: set[int] = set()
        while True:
            await asyncio.sleep(REAP_SECONDS)
            for connection in list(self.server_state.connections):
                # Duck-typed: uvloop's transports are not asyncio.Transport subclasses.
                transport = getattr(connection, "transport", None)
                if transport is None or not transport.is_closing():
                    continue
                if id(connection) in seen:
                    transport.abort()
                else:
                    seen.add(id(connection))

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        runtime = getattr(self.app.state, "runtime", None)
        if runtime is not None:
            # Change streams never end by themselves: end them before uvicorn waits for
            # in-flight requests to finish.
            runtime.end_streams()
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slo-api",
        description="Serve slo-api; every setting comes from the environment (docs/operating.md).",
    )
    parser.add_argument("--version", action="version", version=f"slo-api {__version__}")
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']).upper() or 'settings'}: {e['msg']}"
            for e in exc.errors()
        )
        print(f"slo-api: invalid settings: {problems}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    for warning in settings.warnings(os.environ):
        log.warning("settings: %s", warning)
    try:
        app = create_app(settings)
    except TokenFileError as exc:
        print(f"slo-api: {exc}", file=sys.stderr)
        return 2
    server = make_server(app, settings)
    server.run()
    return 0 if server.started else 1


def make_server(app: FastAPI, settings: Settings) -> Server:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # uvloop, not "auto" (which falls back to asyncio's loop when uvloop is missing): a
        # client that resets its connection with a request pipelined behind its watch is told
        # to no request by uvicorn (it marks only the newest one); uvloop fails the stream's
        # next write, while asyncio's loop drops writes to a lost connection without a word,
        # and such a stream would last until its lifetime. uvloop comes with uvicorn[standard].
        # http stays "auto": httptools when installed.
        loop="uvloop",
        log_config=None,
        access_log=False,
        proxy_headers=True,
        server_header=False,
        lifespan="on",
        # In-flight requests get this long after the server stops accepting; then they are
        # cancelled and the lifespan shutdown runs (terminationGracePeriodSeconds covers both).
        timeout_graceful_shutdown=settings.shutdown_drain_seconds,
    )
    return Server(config, app, settings.shutdown_grace_seconds)


if __name__ == "__main__":
    sys.exit(main())
