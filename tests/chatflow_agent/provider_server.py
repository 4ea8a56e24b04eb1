"""A provider API on 127.0.0.1 for the engine tests (stdlib http.server in a thread): the one network seam.

It replays queued replies and records each request; the SDKs under test talk to it over real HTTP.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeProvider", "Received", "Reply"]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[dict[str, Any]] | None = None
    named_events: bool = False
    done: bool = True


class FakeProvider:
    """Answers POSTs with queued replies (JSON or SSE) and records what it received.

    ``url`` is the server's root plus ``/v1`` (the OpenAI and Anthropic engines' form); ``root`` the
    bare ``http://127.0.0.1:port``. An SSE reply sends each chunk as ``data: <json>`` — preceded by
    ``event: <chunk["type"]>`` when ``named_events`` (Anthropic's framing) — and ends with
    ``data: [DONE]`` when ``done`` (OpenAI's).
    """

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def reply(self, body: Any = None, status: int = 200, **headers: str) -> None:
        self.replies.append(
            Reply(status=status, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
        )

    def reply_stream(self, chunks: list[dict[str, Any]], *, named_events: bool = False, done: bool = True) -> None:
        self.replies.append(Reply(sse=chunks, named_events=named_events, done=done))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                fake.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}"))
                )
                reply = fake.replies.popleft() if fake.replies else Reply(500, {"error": {"message": "no reply"}})
                if reply.sse is not None:
                    self._send_sse(reply)
                else:
                    self._send_json(reply)

            def _send_json(self, reply: Reply) -> None:
                data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in {"Content-Type": "application/json", **reply.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_sse(self, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in reply.sse or []:
                    event = f"event: {chunk['type']}\n" if reply.named_events else ""
                    self.wfile.write(f"{event}data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                if reply.done:
                    self.wfile.write(b"data: [DONE]\n\n")

        return Handler

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
