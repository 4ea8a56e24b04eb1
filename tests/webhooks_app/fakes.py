"""Fake WhatsApp Graph and Telegram Bot API servers: real HTTP servers on loopback that record requests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeProviderAPI:
    """Records every POST as ``{"path", "headers", "json"}``; answers 200 (or ``fail_status``).

    ``hold``: an Event each POST waits for (after being recorded, at most 20 s) before it is answered;
    ``arrived`` is set by every recorded POST.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_status: int | None = None
        self.hold: threading.Event | None = None
        self.arrived = threading.Event()
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with api._lock:
                    api.requests.append({"path": self.path, "headers": dict(self.headers),
                                         "json": json.loads(body or b"null")})
                api.arrived.set()
                if api.hold is not None:
                    api.hold.wait(20)
                status = api.fail_status or 200
                answer = json.dumps({"ok": status == 200, "result": {"message_id": len(api.requests)},
                                     "messages": [{"id": f"wamid.out{len(api.requests)}"}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll so that shutdown() returns at once instead of after serve_forever's half-second poll.
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self) -> FakeProviderAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r["json"] for r in self.requests]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.requests) >= count:
                return self.bodies()
            time.sleep(0.02)
        raise AssertionError(f"expected {count} requests, got {self.bodies()}")
