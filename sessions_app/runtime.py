"""The site's runtime: the one place that builds its session store and its Runner (one of each per process).

``site_store()`` is the site's ``DjangoSessionStore`` (agent names resolved through the registry,
``CHATFLOW_MAX_TURNS`` / ``CHATFLOW_DEDUP_TTL_HOURS`` / ``CHATFLOW_LEASE_SECONDS``); ``site_runner()``
the ``Runner`` on it, for the registry's starting agent and the engine ``CHATFLOW_ENGINE`` names.
Everything that plays or changes turns in this process — views, consumers, management commands,
operator actions — uses these two, so they share the store's in-process turn lock and identity map:
an operator action refused with 409 and a bot turn on the same session see the same lock.

Run-event subscribers (live updates) register once with :func:`add_runner_hook`; every Runner this
module builds — the first one and those rebuilt after a settings change in tests — gets them.
Both objects are built lazily under a lock and dropped (the store closed) when a setting they
depend on changes (``override_settings``) or on :func:`reset`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from sessions_app import registry
from sessions_app.store import DjangoSessionStore

if TYPE_CHECKING:
    from chatflow_agent.core.engines import BaseEngine
    from chatflow_agent.core.runner import Runner, Subscriber

__all__ = ["add_runner_hook", "build_engine", "reset", "runner_hooks", "site_runner", "site_store", "subscribe"]

T = TypeVar("T")

# Settings the store or the Runner is built from: a change (override_settings) drops both.
_SETTINGS = frozenset({
    "CHATFLOW_AGENTS", "CHATFLOW_ENGINE", "CHATFLOW_MAX_TURNS", "CHATFLOW_DEDUP_TTL_HOURS", "CHATFLOW_LEASE_SECONDS",
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "DATABASES", "CHATFLOW_MODEL_PRICES", "CHATFLOW_HOLDING_MESSAGE",
})

#: Called with every Runner this module builds (``hook(runner)``); see :func:`add_runner_hook`.
runner_hooks: list[Callable[[Runner], Any]] = []


class _PerProcess(Generic[T]):
    """A value built on first use by ``build()``, once per process even when threads race for it."""

    def __init__(self, build: Callable[[], T], name: str) -> None:
        self._build = build
        self._value: T | None = None
        #: held while the value is built or dropped; re-entrant: building the Runner builds the store
        self.lock = threading.RLock()
        self.__name__ = self.__qualname__ = name
        self.__doc__ = build.__doc__

    def __call__(self) -> T:
        value = self._value
        if value is None:
            with self.lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def peek(self) -> T | None:
        """The value if it was built, without building it."""
        return self._value

    def forget(self) -> T | None:
        """Drop the value (the next call builds a new one); returns the dropped value."""
        with self.lock:
            value, self._value = self._value, None
        return value


def build_engine() -> BaseEngine:
    """The engine CHATFLOW_ENGINE names: ``demo`` → DemoEngine; ``openai`` → OpenAIEngine on
    OPENAI_API_KEY and OPENAI_BASE_URL (OpenAI's endpoint when empty)."""
    from chatflow_agent.core.engines import DemoEngine, OpenAIEngine

    if settings.CHATFLOW_ENGINE == "openai":
        return OpenAIEngine(api_key=settings.OPENAI_API_KEY, base_url=settings.OPENAI_BASE_URL or None)
    return DemoEngine()


def _build_store() -> DjangoSessionStore:
    """The site's DjangoSessionStore (one per process), resolving agent names through the registry."""
    store = DjangoSessionStore(
        default_max_turns=settings.CHATFLOW_MAX_TURNS,
        dedup_ttl_hours=settings.CHATFLOW_DEDUP_TTL_HOURS,
    )
    store.set_agent_resolver(registry.get_agent)
    return store


def _build_runner() -> Runner:
    """The site's Runner (one per process): the registry's starting agent on site_store()."""
    from chatflow_agent.core.runner import Runner
    from chatflow_agent.pricing import PriceBook

    runner = Runner(registry.starting_agent(), session_store=site_store(), engine=build_engine(),
                    prices=PriceBook(settings.CHATFLOW_MODEL_PRICES))
    # Runner points the store's resolver at its own agent table; the registry's is the same set
    # of agents, and stays the resolver the console relies on (it also serves before any turn).
    site_store().set_agent_resolver(registry.get_agent)
    for hook in list(runner_hooks):
        hook(runner)
    return runner


site_store: _PerProcess[DjangoSessionStore] = _PerProcess(_build_store, "site_store")
site_runner: _PerProcess[Runner] = _PerProcess(_build_runner, "site_runner")


def add_runner_hook(hook: Callable[[Runner], Any]) -> Callable[[Runner], Any]:
    """Call ``hook(runner)`` for the site's Runner: now if it is built, and for every Runner built later.

    Usable as a decorator. Registering the same hook twice has no effect. A hook runs while the
    Runner is being built: it uses the runner it is given and must not call :func:`site_runner`.
    """
    with site_runner.lock:
        if hook in runner_hooks:
            return hook
        runner_hooks.append(hook)
        runner = site_runner.peek()
    if runner is not None:
        hook(runner)
    return hook


def subscribe(subscriber: Subscriber) -> Subscriber:
    """Subscribe ``subscriber(event)`` to the run events of the site's Runner (current and future ones)."""

    def hook(runner: Runner) -> None:
        runner.subscribe(subscriber)

    hook.__qualname__ = f"subscribe({getattr(subscriber, '__qualname__', subscriber)!s})"
    hook.subscriber = subscriber  # type: ignore[attr-defined]
    if not any(getattr(h, "subscriber", None) is subscriber for h in runner_hooks):
        add_runner_hook(hook)
    return subscriber


def reset() -> None:
    """Drop the site's Runner and store (closing the store); the next call builds new ones. For tests."""
    with site_runner.lock:
        site_runner.forget()
        store = site_store.forget()
    if store is not None:
        store.close()


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: object) -> None:
    if setting in _SETTINGS:
        reset()
