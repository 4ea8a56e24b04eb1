"""A deterministic engine for tests: plays a FIFO script of answers (like httpx's ``MockTransport``).

engine = ScriptedEngine(
    EngineTurnResult(tool_calls=[ToolCall(id="c1", name="check_order_status", args={"order_id": "7"})]),
    "Order 7 ships tomorrow.",
)
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult, TextDeltaCallback
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["ScriptExhaustedError", "ScriptStep", "ScriptedEngine", "split_words"]

StepFunction = Callable[["Agent", list[Message]], EngineTurnResult | str | Awaitable[EngineTurnResult | str]]
ScriptStep = EngineTurnResult | str | BaseException | StepFunction


class ScriptExhaustedError(ProviderError):
    """The engine was called more times than it has steps."""


def split_words(text: str) -> list[str]:
    """``text`` in word-sized pieces that join back to ``text`` exactly (``"a b"`` → ``["a ", "b"]``)."""
    return [piece for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]


class ScriptedEngine(BaseEngine):
    """Answers each call with the next step of its script.

    A step is an ``EngineTurnResult`` (returned), a ``str`` (a text answer), an exception
    instance (raised) or a callable ``(agent, history) -> EngineTurnResult | str`` (sync or
    async). ``calls`` records ``(agent name, copy of history)`` per call, including calls that
    raise. With ``stream=True``, :meth:`stream_turn_async` reports the text word by word.
    ``delay`` (seconds) is awaited before each answer. No step left → :class:`ScriptExhaustedError`.
    A step's usage is what the script says: an ``EngineTurnResult(..., usage=ModelCallUsage(...))``
    reports it; a ``str`` step reports none (``usage`` is ``None``).
    """

    provider = None

    def __init__(self, *steps: ScriptStep, delay: float = 0.0, stream: bool = False) -> None:
        self._steps: deque[ScriptStep] = deque()
        self.push(*steps)
        self.delay = delay
        self.stream = stream
        self.calls: list[tuple[str, list[Message]]] = []

    def push(self, *steps: ScriptStep) -> ScriptedEngine:
        """Append steps to the script; returns the engine for chaining."""
        for step in steps:
            if not isinstance(step, (EngineTurnResult, str, BaseException)) and not callable(step):
                raise TypeError(f"A script step must be an EngineTurnResult, str, exception or callable, not {step!r}")
            self._steps.append(step)
        return self

    @property
    def remaining(self) -> int:
        """How many steps are left."""
        return len(self._steps)

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """The next step's answer. Raises the step's exception, or ``ScriptExhaustedError``."""
        self.calls.append((agent.name, [m.model_copy(deep=True) for m in history]))
        if not self._steps:
            last = history[-1].content if history else None
            raise ScriptExhaustedError(
                f"ScriptedEngine has no step left for call #{len(self.calls)} "
                f"(agent {agent.name!r}, last message {last!r}); push() more steps."
            )
        step = self._steps.popleft()
        if self.delay:
            await asyncio.sleep(self.delay)
        if isinstance(step, BaseException):
            raise step
        if callable(step) and not isinstance(step, (EngineTurnResult, str)):
            answer = step(agent, history)
            return _as_result(await answer if inspect.isawaitable(answer) else answer)
        return _as_result(step)

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """Like :meth:`generate_turn_async`; with ``stream=True`` the text arrives word by word."""
        result = await self.generate_turn_async(agent, history)
        if self.stream and result.text:
            for piece in split_words(result.text):
                await on_text_delta(piece)
        return result


def _as_result(value: Any) -> EngineTurnResult:
    if isinstance(value, EngineTurnResult):
        return value
    if isinstance(value, str):
        return EngineTurnResult(text=value)
    raise TypeError(f"A script step produced {value!r}; expected an EngineTurnResult or a str")
