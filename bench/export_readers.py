"""Slow readers of the bulk export against a real daphne: the server's resident memory before, while N clients
have read the start of ``/api/v1/export.jsonl`` and stopped reading, and after they left.

    python bench/export_readers.py                          # 3,000 sessions, 40 readers, 15 s paused
    python bench/export_readers.py --readers 10 --pause 5

Builds a SQLite database in a temporary directory (``bench/export.py``'s sessions: 20 messages each), starts
``daphne`` on a free loopback port with production settings and no embedded worker, then opens ``--readers``
connections that each send the request with an API token, read 1 KB and pause (a small receive buffer, so the
client's kernel takes little of what the server writes). Samples the server's VmRSS every half second while
they pause, closes them, and samples again. Every connection goes to 127.0.0.1 and the run ends by itself.
Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import export as export_bench  # noqa: E402 - bench/export.py: the database it builds


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token() -> str:
    from django.contrib.auth.models import Group, User

    from api_app.models import ApiToken

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True})
    user.groups.add(Group.objects.get(name="Operators"))
    return ApiToken.issue("bench", user)[1]


def start_daphne(url: str, port: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATFLOW_", "DATABASE_URL", "REDIS_URL"))}
    env.update(CHATFLOW_ENV_FILE="", DATABASE_URL=url, DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50),
               ALLOWED_HOSTS="127.0.0.1", SECURE_SSL_REDIRECT="0", CHATFLOW_EMBEDDED_WORKER="off")
    with log.open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                 "chatflow_site.asgi:application"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz/", timeout=2):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"daphne did not start; see {log}")


def full_size(port: int, secret: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/export.jsonl",
                                     headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return sum(len(chunk) for chunk in iter(lambda: response.read(1 << 16), b""))


def slow_reader(port: int, secret: str) -> tuple[socket.socket, int]:
    """A connection that asked for the export and read its first KB; returns it (paused) and the status."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /api/v1/export.jsonl HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}\r\n"
                 "Connection: close\r\n\r\n".encode())
    head = sock.recv(1024)
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return sock, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--readers", type=int, default=40)
    parser.add_argument("--pause", type=float, default=15.0, help="seconds the readers stay paused")
    parser.add_argument("--after", type=float, default=5.0, help="seconds sampled after they closed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chatflow-bench-readers-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'export.db'}"
        export_bench.setup_django(url)
        export_bench.build(args.sessions, 1000)
        secret = token()
        port = free_port()
        proc = start_daphne(url, port, Path(tmp) / "daphne.log")
        try:
            size = full_size(port, secret)
            time.sleep(1.0)
            before = rss_mb(proc.pid)
            readers = [slow_reader(port, secret) for _ in range(args.readers)]
            statuses: dict[int, int] = {}
            for _, status in readers:
                statuses[status] = statuses.get(status, 0) + 1
            during = []
            end = time.monotonic() + args.pause
            while time.monotonic() < end:
                during.append(rss_mb(proc.pid))
                time.sleep(0.5)
            for sock, _ in readers:
                sock.close()
            after = []
            end = time.monotonic() + args.after
            while time.monotonic() < end:
                time.sleep(0.5)
                after.append(rss_mb(proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
    result = {"sessions": args.sessions, "export_mb": round(size / 2**20, 1), "readers": args.readers,
              "statuses": statuses, "rss_before_mb": round(before, 1), "rss_peak_paused_mb": round(max(during), 1),
              "rss_after_mb": round(after[-1], 1)}
    print(f"\n{args.readers} readers of a {result['export_mb']} MB export ({args.sessions:,} sessions), "
          f"paused after 1 KB for {args.pause:.0f} s; statuses {statuses}")
    print(f"  daphne RSS: before {result['rss_before_mb']} MB, peak while paused {result['rss_peak_paused_mb']} MB, "
          f"{args.after:.0f} s after they closed {result['rss_after_mb']} MB")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
