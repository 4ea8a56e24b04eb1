"""The embedded worker under a real daphne: a child process of the server that plays the webhook turns,
whose run events still reach the console's websockets (relayed over a pipe to the server's in-memory
channel layer), that is replaced when it dies, and that never outlives the server."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from sessions_app.models import ChatMessage
from tests.processes import TEST_REDIS_URL, redis_up, stop
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.wsclient import WebSocket
from webhooks_app.models import InboundDelivery

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REDIS_URL = TEST_REDIS_URL


@pytest.fixture
def apis():
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        yield wa, tg


@pytest.fixture
def server(apis, tmp_path, request):
    """daphne with the embedded worker (``auto``), on the test database; stopped (group) afterwards.
    Indirect parameter ``"redis"``: with the Redis channel layer (else the default in-memory one)."""
    wa, tg = apis
    layer = {"REDIS_URL": REDIS_URL} if getattr(request, "param", "memory") == "redis" else {}
    env = s.child_env(wa.base, tg.base, tmp_path, CHATFLOW_QUEUE_VISIBILITY_SECONDS="2", **layer)
    proc, base = s.start_daphne(env, tmp_path / "daphne.log")
    yield proc, base
    stop(proc)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def worker_children(server_pid: int) -> list[int]:
    """Live ``chatflow_worker --embedded`` processes whose parent is ``server_pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server_pid and b"chatflow_worker" in cmdline and b"--embedded" in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def the_worker(server_pid: int, other_than: int | None = None) -> int:
    found: list[int] = []

    def one() -> bool:
        found[:] = [pid for pid in worker_children(server_pid) if pid != other_than]
        return len(found) == 1

    s.wait_until(one, 30, "one embedded worker process")
    return found[0]


def post_wa(base: str, wamid: str, text: str, wa_id: str = "15550100") -> None:
    body = p.whatsapp(p.wa_text(wamid, text, wa_id=wa_id), wa_id=wa_id)
    assert s.post(f"{base}/webhooks/whatsapp/", body, s.wa_headers(body))[0] == 200


def engine_pids(tmp: Path) -> list[int]:
    return [int(line.split("\t")[0]) for line in s.engine_calls(tmp)]


@pytest.mark.parametrize("server", [
    "memory",  # the child's publishes relayed over a pipe to the server's in-memory layer
    pytest.param("redis", marks=pytest.mark.skipif(not redis_up(), reason="no Redis on 127.0.0.1:6379")),
], indirect=True)
def test_a_webhook_turn_is_played_by_the_servers_child_process_and_streamed_live_to_the_console(
        apis, server, tmp_path):
    wa, _ = apis
    proc, base = server
    child = the_worker(proc.pid)
    assert child != proc.pid
    sender = f"1555{uuid.uuid4().int % 10**8:08d}"  # its own group: other test runs may share this Redis
    post_wa(base, "wamid.L1", "first", sender)
    wa.wait_for(1)
    staff = User.objects.create_superuser("root", "root@example.test", p.WA_SECRET)
    client = Client()
    client.force_login(staff)
    last = ChatMessage.objects.filter(session_id=sender).order_by("-id").values_list("id", flat=True)[0]
    page = WebSocket(int(base.rsplit(":", 1)[1]), f"/ws/sessions/{sender}/",
                     cookie=f"sessionid={client.cookies['sessionid'].value}")
    try:
        page.send({"type": "resume", "after": last, "order": "newest", "tail": True, "page": 1})
        page.receive_until("Live updates on.")
        post_wa(base, "wamid.L2", "second [slow 0.3]", sender)
        text = page.receive_until('id="live-cursor"')
    finally:
        page.close()
    assert text.index("turn running") < text.index("second [slow 0.3]") < text.rindex("echo: second [slow 0.3]")
    assert engine_pids(tmp_path) == [child, child]  # both turns played by the child, none by the server
    assert [b["text"]["body"] for b in wa.wait_for(2)] == ["echo: first", "echo: second [slow 0.3]"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_worker_process_finishes_its_turn_and_exits_when_the_server_dies(apis, server, tmp_path, sig):
    wa, _ = apis
    proc, base = server
    child = the_worker(proc.pid)
    post_wa(base, "wamid.D1", "last words [slow 1]")
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == 1, 20, "the turn to start")
    os.kill(proc.pid, sig)  # the server alone, not its process group
    proc.wait(30)
    s.wait_until(lambda: not alive(child), 90, "the worker process to exit")
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: last words [slow 1]"]
    d = InboundDelivery.objects.get()
    assert (d.status, d.attempts, d.reply_status) == ("done", 1, "sent")


def test_a_killed_worker_process_is_replaced_and_its_delivery_played_exactly_once(apis, server, tmp_path):
    wa, _ = apis
    proc, base = server
    doomed = the_worker(proc.pid)
    (tmp_path / "block").touch()
    post_wa(base, "wamid.K1", "survive [block]")
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == 1, 20, "the turn to start")
    os.kill(doomed, signal.SIGKILL)  # claimed, turn in progress, nothing committed
    (tmp_path / "block").unlink()
    successor = the_worker(proc.pid, other_than=doomed)
    wa.wait_for(1, timeout=90)  # the dead turn's session lease (30 s) must expire first
    s.wait_until(lambda: InboundDelivery.objects.get().status == "done", 20, "the delivery to finish")
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: survive [block]"]
    assert ChatMessage.objects.filter(session_id="15550100").count() == 2
    d = InboundDelivery.objects.get()
    assert (d.status, d.attempts, d.reply_status) == ("done", 2, "sent")
    assert engine_pids(tmp_path) == [doomed, successor]
    log = (tmp_path / "daphne.log").read_text()
    assert f"The embedded queue worker (pid {doomed}) exited with status -9" in log


def test_a_server_stopped_during_a_stuck_turn_cancels_it_and_requeues_the_delivery(apis, server, tmp_path):
    wa, _ = apis
    proc, base = server
    child = the_worker(proc.pid)
    (tmp_path / "block").touch()
    post_wa(base, "wamid.S1", "stuck [block]")
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == 1, 20, "the turn to start")
    os.kill(proc.pid, signal.SIGTERM)  # the server alone: it closes the child's stdin, then signals it
    proc.wait(60)
    s.wait_until(lambda: not alive(child), 60, "the worker process to exit")
    assert ChatMessage.objects.filter(session_id="15550100").count() == 0 and wa.bodies() == []
    d = InboundDelivery.objects.get()
    assert (d.status, d.attempts, d.lease_owner) == ("queued", 0, "")  # rolled back, given back to the queue
