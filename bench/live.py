"""Latency of the live path: a run event leaves the Runner → the websocket client has the fragment.

    python bench/live.py                     # in-process layer, then Redis (REDIS_URL or redis://127.0.0.1:6379/12)
    python bench/live.py --n 2000 --layers memory

For each channel layer (a fresh process each), a temporary SQLite database (the site's settings) gets
a staff viewer and a session; a ``WebsocketCommunicator`` connects to ``ws/sessions/<id>/`` through the
site's ASGI application (origin check, session-cookie auth, the real consumer) and resumes. Then, one at
a time, a run event is handed to the publisher exactly as the Runner hands it to its subscribers, and
the time until the client has received the rendered fragment is recorded:

- ``text_delta``: a streamed word (rendered on the event loop, no database);
- ``message_appended``: a model message with a tool call (the console's ``item`` partial);
- ``turn_completed``: the committed turn read back from the database and rendered (one turn, 2 rows).

With Redis the event goes publisher → Redis → consumer even though both ends share a process (the
consumer does not know where the event came from). Prints a table and a JSON line per layer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SESSION = "bench:live"


def setup_django(db: Path, redis_url: str) -> None:
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=f"sqlite:///{db}", DEBUG="1", REDIS_URL=redis_url,
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed() -> tuple[bytes, int]:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from chatflow_agent.types import Message, Role
    from sessions_app.models import ChatMessage, ChatSession

    user = User.objects.create_user("bench.viewer", password="x" * 20, is_staff=True)
    user.groups.add(Group.objects.get(name="Viewers"))
    session = ChatSession.objects.create(session_id=SESSION, active_agent_name="Support")
    for role, text in ((Role.USER, "hi"), (Role.MODEL, "hello")):
        m = Message(role=role, content=text)
        ChatMessage.objects.create(session=session, role=role.value, content=text, message_json=m.model_dump_json())
    client = Client()
    client.force_login(user)
    last = ChatMessage.objects.order_by("-id").values_list("id", flat=True)[0]
    return f"sessionid={client.cookies['sessionid'].value}".encode(), last


def commit_turn(n: int) -> list[int]:
    from chatflow_agent.types import Message, Role
    from sessions_app.models import ChatMessage

    ids = []
    for role, text in ((Role.USER, f"question {n}"), (Role.MODEL, f"answer {n}")):
        m = Message(role=role, content=text)
        ids.append(ChatMessage.objects.create(session_id=SESSION, role=role.value, content=text,
                                              message_json=m.model_dump_json()).id)
    return ids


def events(kind: str, n: int):
    from chatflow_agent.core.events import MessageAppended, TextDelta, TurnCompleted
    from chatflow_agent.types import AgentResponse, Message, Role, ToolCall

    if kind == "text_delta":
        return TextDelta(session_id=SESSION, turn_id="t", text=f"word{n} ", agent_name="Support")
    if kind == "message_appended":
        msg = Message(role=Role.MODEL, content=None,
                      tool_calls=[ToolCall(id=f"c{n}", name="check_order_status", args={"order_id": str(n)})])
        return MessageAppended(session_id=SESSION, turn_id="t", message=msg, agent_name="Support", index=1)
    return TurnCompleted(session_id=SESSION, turn_id=f"t{n}", duration_ms=1.0,
                         response=AgentResponse(content="ok", active_agent_name="Support"))


async def measure(n: int, cookie: bytes, last: int) -> dict[str, list[float]]:
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer
    from channels.testing import WebsocketCommunicator

    from chatflow_site.asgi import application
    from sessions_app.live import publisher

    ws = WebsocketCommunicator(application, f"/ws/sessions/{SESSION}/",
                               headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])
    results: dict[str, list[float]] = {}
    try:
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"type": "resume", "after": last})
        await ws.receive_from(timeout=10)
        # Start a turn once so deltas and messages land in an open live turn (no re-open fragment).
        from chatflow_agent.core.events import TurnStarted

        publisher(TurnStarted(session_id=SESSION, turn_id="t", agent_name="Support", user_message="go"))
        await ws.receive_from(timeout=10)
        for kind in ("text_delta", "message_appended", "turn_completed"):
            samples = results[kind] = []
            count = n if kind != "turn_completed" else max(50, n // 10)
            for i in range(count + 20):  # 20 warm-up rounds
                if kind == "turn_completed":
                    await database_sync_to_async(commit_turn)(i)
                event = events(kind, i)
                started = time.perf_counter()
                publisher(event)  # what the Runner calls inside the turn
                await ws.receive_from(timeout=10)
                if i >= 20:
                    samples.append((time.perf_counter() - started) * 1000)
    finally:
        await ws.disconnect()
        layer = get_channel_layer()
        if hasattr(layer, "close_pools"):
            await layer.close_pools()
    return results


def child(layer: str, n: int, redis_url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(Path(tmp) / "bench.db", redis_url if layer == "redis" else "")
        import logging

        logging.disable(logging.WARNING)
        cookie, last = seed()
        results = asyncio.run(measure(n, cookie, last))
    out = {"layer": layer}
    for kind, samples in results.items():
        samples.sort()
        out[kind] = {"n": len(samples), "p50_ms": round(statistics.median(samples), 3),
                     "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3)}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="events per kind (turn_completed: n/10, at least 50)")
    parser.add_argument("--layers", default="memory,redis")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/12")
    parser.add_argument("--child", default="")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.redis_url)
        return
    print(f"{'layer':8} {'event':18} {'n':>6} {'p50 ms':>9} {'p99 ms':>9}")
    for layer in args.layers.split(","):
        done = subprocess.run([sys.executable, __file__, "--child", layer, "--n", str(args.n),
                               "--redis-url", args.redis_url], capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            raise SystemExit(done.returncode)
        line = done.stdout.strip().splitlines()[-1]
        data = json.loads(line)
        for kind in ("text_delta", "message_appended", "turn_completed"):
            r = data[kind]
            print(f"{layer:8} {kind:18} {r['n']:>6} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f}")
        print(line)


if __name__ == "__main__":
    main()
