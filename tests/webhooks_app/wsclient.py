"""A minimal websocket client (RFC 6455, text frames) for talking to a real daphne process in tests."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any


class WebSocket:
    """``WebSocket(port, path, cookie)``: handshake on connect; ``send``/``receive`` text; ``close()``."""

    def __init__(self, port: int, path: str, cookie: str = "", timeout: float = 20.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   f"Sec-WebSocket-Version: 13\r\n" + (f"Cookie: {cookie}\r\n" if cookie else "") + "\r\n")
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError(f"handshake refused: {head!r}")
            head += chunk
        self.status = int(head.split(b" ", 2)[1])
        if self.status != 101:
            raise ConnectionError(f"handshake refused: {head!r}")

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def send(self, data: Any) -> None:
        payload = (data if isinstance(data, str) else json.dumps(data)).encode()
        mask = os.urandom(4)
        n = len(payload)
        header = struct.pack("!BB", 0x81, 0x80 | n) if n < 126 else struct.pack("!BBH", 0x81, 0x80 | 126, n)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def receive(self) -> str:
        """The next text frame (pings are skipped); ConnectionError when the server closes."""
        while True:
            first, second = self._exact(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError(f"closed by the server: {payload!r}")
            if opcode == 0x1:
                return payload.decode()

    def receive_until(self, marker: str) -> str:
        """Text frames, joined by newlines, up to and including the first that contains ``marker``."""
        frames: list[str] = []
        while not frames or marker not in frames[-1]:
            frames.append(self.receive())
        return "\n".join(frames)

    def close(self) -> None:
        self.sock.close()
