"""The site's agents: the starting agent built by the CHATFLOW_AGENTS factory and every agent it can reach.

``starting_agent()`` calls the factory once per process (the result is cached and dropped when the
setting changes, e.g. under ``override_settings``); ``agents()`` walks the handoff graph from it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["agents", "get_agent", "starting_agent"]


@functools.cache
def starting_agent() -> Agent:
    """The agent new sessions start with. Import or factory errors → ImproperlyConfigured naming CHATFLOW_AGENTS."""
    from chatflow_agent.core.agent import Agent

    path = settings.CHATFLOW_AGENTS
    try:
        factory = import_string(path)
    except ImportError as err:
        raise ImproperlyConfigured(f"CHATFLOW_AGENTS: cannot import {path!r}: {err}") from err
    agent = factory() if callable(factory) else factory
    if not isinstance(agent, Agent):
        raise ImproperlyConfigured(f"CHATFLOW_AGENTS: {path!r} returned {type(agent).__name__}, not an Agent")
    return agent


@functools.cache
def agents() -> dict[str, Agent]:
    """Every agent reachable from the starting agent through handoffs, by name, starting agent first."""
    found: dict[str, Agent] = {}
    pending = [starting_agent()]
    while pending:
        agent = pending.pop(0)
        if agent.name in found:
            continue
        found[agent.name] = agent
        pending.extend(agent.handoffs)
    return found


def get_agent(name: str) -> Agent | None:
    """The registered agent called ``name``, or None."""
    return agents().get(name)


@receiver(setting_changed)
def _forget_agents(*, setting: str, **kwargs: object) -> None:
    if setting == "CHATFLOW_AGENTS":
        starting_agent.cache_clear()
        agents.cache_clear()
