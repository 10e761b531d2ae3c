"""A small HTTP proxy of the bench's own: a bucket's round trip, and its bill, on loopback.

It stands between evalsnap and an emulator (moto, fake-gcs-server), waits ``latency_ms``
before forwarding each request (a real bucket is 10-50 ms away; the emulators answer in
about one), and counts every request by method: what the bucket would bill. Its counts are
independent of evalsnap's own (``store_requests`` in ``--json``), so the bench checks one
against the other.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["LatencyProxy"]

_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "content-length", "host"}


def _area(path: str) -> str:
    """``v1/objects/unit`` / ``v1/refs/index/unit`` / ``v1/prefect`` … of a request path (a
    listing's prefix parameter included), for the breakdown."""
    from urllib.parse import unquote

    text = unquote(unquote(path))
    for marker in ("/o/", "prefix=", "name="):  # GCS: the object's name comes after these
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    if "v1/" not in text:
        return "bucket"
    parts = text.split("v1/", 1)[1].replace("&", "/").replace("?", "/").split("/")
    depth = 3 if parts[0] == "refs" and len(parts) > 2 and parts[1] == "index" else 2
    return "v1/" + "/".join(parts[:depth])


class LatencyProxy:
    """``with LatencyProxy(upstream, latency_ms) as proxy:`` → ``proxy.url``, ``proxy.counts``."""

    def __init__(self, upstream: str, latency_ms: float = 0.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.latency = latency_ms / 1000.0
        self.counts: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        """Requests by method and store area (``GET v1/objects/unit``): where they go."""
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def reset(self) -> dict[str, int]:
        """The counts so far (by method, and ``total``), then zero."""
        with self._lock:
            out = dict(self.counts)
            self.counts.clear()
            self.last_paths = dict(self.paths)
            self.paths.clear()
        out["total"] = sum(out.values())
        return out

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.counts[request.method] += 1
            self.paths[f"{request.method} {_area(request.path_qs)}"] += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Host"] = request.headers.get("Host", "")
        assert self._session is not None
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=headers, data=body or None,
                                         allow_redirects=False) as upstream:
            payload = await upstream.read()
            out = web.Response(status=upstream.status, body=payload)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP and key.lower() != "content-encoding":
                    out.headers.add(key, value)
            return out

    async def _start(self) -> str:
        self._session = aiohttp.ClientSession(auto_decompress=False,
                                              connector=aiohttp.TCPConnector(limit=256))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
