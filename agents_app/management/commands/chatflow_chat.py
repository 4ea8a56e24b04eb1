"""`manage.py chatflow_chat [--session ID] [--agent NAME]`: chat with the site's agents in the terminal.

Every line read from stdin is one turn, played by the site's Runner on the site's store (the same
sessions the console shows; a turn here and a bot turn on the same session are serialised). The
answer streams as it is generated; tool calls, tool results and handoffs are printed as they
happen. ``/quit`` (or end of input) leaves. Works with piped stdin: ``echo "where is order A-1" |
manage.py chatflow_chat``.

The session id is taken as typed or refused, by the rule every entry point applies
(``sessions_app.ids.id_problem``: no white space at either end, no control characters…); a customer's
session (one a webhook delivers to, or one whose metadata names a customer channel) is refused, as the
live chat refuses it (``agents_app.views.chat_refusal``): a line typed here would be stored as the
customer's own message.

Exit status: 0; 1 when a turn failed (the chat goes on; the errors are on stderr) or for a bad
argument (an id refused, a customer's session, an unknown agent); 130 when interrupted with Ctrl+C.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents_app.views import chat_refusal
from chatflow_agent.core.events import (
    HandoffOccurred,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnCompleted,
)
from sessions_app import registry, runtime
from sessions_app.ids import id_problem
from sessions_app.live import flush_before_close

_QUIT = {"/quit", "/exit", "/q"}
_HANDOFF_PREFIX = "transfer_to_"
_SHOWN_CHARS = 300  # tool arguments and results are cut to this length


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


class Command(BaseCommand):
    help = "Chat with the site's agents in the terminal (one turn per line; /quit leaves)."
    stealth_options = ("stdin",)  # call_command(..., stdin=io.StringIO(...)) in tests

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--session", default=None, help="session id to use or continue (default: a new one)")
        parser.add_argument("--agent", default=None, help="make this registered agent the session's active agent")

    def handle(self, *args, session: str | None, agent: str | None, **options) -> None:
        stdin: TextIO = options.get("stdin") or sys.stdin
        session_id = session if session is not None else f"terminal-{secrets.token_hex(4)}"
        if problem := id_problem(session_id):  # the rule every entry point applies: never cleaned
            raise CommandError(f"--session {session_id!r} {problem}")
        if agent is not None and registry.get_agent(agent) is None:
            raise CommandError(f"unknown agent {agent!r}; registered agents: {', '.join(registry.agents())}")
        runner = runtime.site_runner()
        existing = runner.session_store.get(session_id)
        if existing is not None and (refusal := chat_refusal(session_id, existing.metadata)):
            raise CommandError(refusal)
        current = existing.active_agent.name if existing is not None else runner.starting_agent.name
        self.stdout.write(f"Session {session_id!r} with {agent or current} "
                          f"({'continuing' if existing else 'new'}). Type /quit to leave.")
        if agent is not None and agent != current:
            self._switch_agent(runner, session_id, agent)
        interactive = stdin.isatty()
        failed = 0
        try:
            while True:
                if interactive:
                    self.stdout.write("you> ", ending="")
                    self.stdout.flush()
                line = stdin.readline()
                if not line or line.strip() in _QUIT:
                    break
                if line.strip():
                    failed += not asyncio.run(self._turn(runner, session_id, line.rstrip("\r\n")))
        except KeyboardInterrupt:
            self.stdout.write("")
            raise CommandError("interrupted", returncode=130) from None
        if failed:
            raise CommandError(f"{failed} turn{'s' if failed != 1 else ''} failed (see above)")

    def _switch_agent(self, runner: Any, session_id: str, agent: str) -> None:
        """Make ``agent`` active through the store's turn lock (as the console's force handoff does)."""
        with runner.session_store.sync_turn(session_id, runner.starting_agent, {"channel": "terminal"}) as session:
            session.set_active_agent(registry.get_agent(agent))

    async def _turn(self, runner: Any, session_id: str, text: str) -> bool:
        """Play one turn, printing its events; False when it failed."""
        printer = _Printer(self.stdout)
        try:
            async for event in runner.run_streamed(session_id, text, metadata={"channel": "terminal"}):
                printer.show(event)
        except Exception as err:
            printer.end_line()
            self.stderr.write(f"error: the turn failed and was rolled back ({type(err).__name__}: {err})")
            return False
        finally:
            await flush_before_close()  # this turn's loop closes next: its last live updates go out first
        return True


class _Printer:
    """Writes a turn's events: the streamed answer on ``Agent: …`` lines, tool calls and handoffs indented."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.open_line = False  # an "Agent: …" line is being streamed
        self.streamed = False  # text was streamed since the last tool event

    def end_line(self) -> None:
        if self.open_line:
            self.out.write("")
            self.open_line = False

    def note(self, text: str) -> None:
        self.end_line()
        self.out.write(f"  {text}")
        self.streamed = False

    def show(self, event: RunEvent) -> None:
        if isinstance(event, TextDelta):
            if not self.open_line:
                self.out.write(f"{event.agent_name}: ", ending="")
                self.open_line = True
            self.out.write(event.text, ending="")
            self.out.flush()
            self.streamed = True
        elif isinstance(event, ToolCallStarted) and not event.call.name.startswith(_HANDOFF_PREFIX):
            self.note(f"[tool] {event.call.name}({_short(event.call.args)})")
        elif isinstance(event, ToolCallFinished) and not event.result.name.startswith(_HANDOFF_PREFIX):
            outcome = "error" if event.result.is_error else "result"
            self.note(f"[{outcome}] {event.result.name} → {_short(event.result.content)}")
        elif isinstance(event, HandoffOccurred):
            reason = f": {event.handoff.reason}" if event.handoff.reason else ""
            self.note(f"[handoff] {event.from_agent} → {event.to_agent}{_short(reason)}")
        elif isinstance(event, TurnCompleted):
            if not self.streamed:  # an engine that does not stream: print the answer whole
                self.end_line()
                self.out.write(f"{event.response.active_agent_name}: {event.response.content}")
            self.end_line()
