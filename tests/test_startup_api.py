"""The temporary API's warm-up (evalsnap.startup): once the server answers its health check,
it is sent the reads that make its first-request and first-query set-up happen while the
CLI is still busy, and nothing that creates anything."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from evalsnap import startup


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, bytes]] = []
    fail_after_health = False

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, body))
        if self.fail_after_health and not self.path.endswith("/health"):
            self.send_response(500)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


class _Running:
    """A server process that has not exited."""

    def poll(self) -> None:
        return None


@pytest.fixture
def api() -> Any:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()
        _Recorder.fail_after_health = False


def test_the_warm_up_reads_the_run_tables_once_the_server_answers(api: str,
                                                                    monkeypatch: Any) -> None:
    monkeypatch.setattr(startup, "_healthy", [])
    startup._wait_and_warm(api, _Running(), timeout=10)
    assert startup._healthy == [True]
    methods_paths = [(m, p) for m, p, _ in _Recorder.seen]
    assert methods_paths[0] == ("GET", "/api/health")
    assert methods_paths[1:] == [("GET", "/api/admin/version"),
                                 ("POST", "/api/flow_runs/filter"),
                                 ("POST", "/api/task_runs/filter")]
    # reads only: a filter of one row, nothing that creates a flow or a run
    assert all(b == b'{"limit": 1}' for m, _, b in _Recorder.seen if m == "POST")


def test_a_failing_warm_up_is_no_failure_of_the_start(api: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(startup, "_healthy", [])
    _Recorder.fail_after_health = True
    startup._wait_and_warm(api, _Running(), timeout=10)
    assert startup._healthy == [True]  # the flow's own first call reports real problems
    assert [p for _, p, _ in _Recorder.seen] == ["/api/health", "/api/admin/version"]
