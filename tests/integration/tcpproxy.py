"""A loopback TCP proxy that can delay, stall, freeze or cut what the API server sends back."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import yaml


class TcpProxy:
    """Started and stopped by `async with` (or `start()` and `stop()`)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.refusing = False  # new connections are dropped at once, as by a stopped server
        self.delay = 0.0
        self.delayed = 0  # answers (chunks from the API server) held by `delay` so far
        self.stalled = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # Connections frozen by `freeze()`, by the writer towards the client.
        self._frozen: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        """Close every open connection (new ones are still accepted)."""
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def down(self) -> None:
        """Drop every connection and refuse new ones, as a stopped API server does."""
        self.refusing = True
        self.cut()

    def up(self) -> None:
        """Accept connections again."""
        self.refusing = False

    def freeze(self) -> int:
        """Silence every open connection for good, without closing it (a dead network path).

        New connections pass as usual. Returns how many connections were frozen.
        """
        self._frozen |= self._writers
        return len(self._writers) // 2

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(
                self._pump(reader, up_writer, slow=False),
                self._pump(up_reader, writer, slow=True),
                return_exceptions=True,
            )
        for w in (writer, up_writer):
            self._writers.discard(w)
            self._frozen.discard(w)
            w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if slow:
                    while (self.stalled or writer in self._frozen) and not writer.is_closing():
                        await asyncio.sleep(0.05)
                    if self.delay:
                        self.delayed += 1
                        await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        writer.close()

    def kubeconfig(self, original: Path, target: Path) -> Path:
        """A copy of a kubeconfig whose server is this proxy (the TLS name stays 127.0.0.1)."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        target.write_text(yaml.safe_dump(config))
        return target
