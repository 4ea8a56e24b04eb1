"""What the browser tests share: Chromium within a module, the site's seeded databases within a pytest process.

``chromium`` (module scope) launches Debian's chromium once per set of command-line switches and hands
each test a browser whose contexts (cookies, storage, pages) are closed after the test, so tests never see
each other's logins. ``sites`` (session scope) migrates a SQLite database once, seeds a copy once per seed
script, and gives every site a copy of that template (SQLite's backup API: a consistent file even in WAL
mode) instead of running ``migrate`` and the seed again; :meth:`Sites.running` then serves the copy with
daphne. Both are conftest fixtures (imported by ``tests/conftest.py``). Chromium lives no longer than a
module: Playwright's sync API keeps an event loop on the main thread while it runs, and the asyncio tests
that follow in the same process need that thread's loop to themselves.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.processes import REPO, free_port, run_manage, site_env, stop, wait_for_http

CHROMIUM = Path("/usr/bin/chromium")
#: How long an ``expect`` on a page waits for its condition, in milliseconds (a bound, not a pace).
EXPECT_TIMEOUT_MS = 20_000


def copy_database(source: Path, target: Path) -> None:
    """``source`` SQLite file copied to ``target`` through SQLite's backup API (committed WAL pages too)."""
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


class Chromium:
    """One Chromium process per distinct list of switches, launched on first use, closed with the session."""

    def __init__(self, playwright: Any) -> None:
        self._playwright = playwright
        self._browsers: dict[tuple[str, ...], Any] = {}

    def launched(self, args: tuple[str, ...] | list[str] = ()) -> Any:
        """The Playwright ``Browser`` running with ``args`` (launched now if none is)."""
        key = tuple(args)
        browser = self._browsers.get(key)
        if browser is None or not browser.is_connected():
            browser = self._playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(key))
            self._browsers[key] = browser
        return browser

    @contextlib.contextmanager
    def fresh(self, args: tuple[str, ...] | list[str] = ()) -> Iterator[Any]:
        """The browser for ``args``; every context opened on it meanwhile is closed when the block ends."""
        browser = self.launched(args)
        before = set(browser.contexts)
        try:
            yield browser
        finally:
            for context in browser.contexts:
                if context not in before:
                    context.close()

    def close(self) -> None:
        for browser in self._browsers.values():
            browser.close()
        self._browsers.clear()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    """Playwright and its Chromium processes for one test module. Skips without Debian's chromium.

    Playwright's ``expect`` waits up to :data:`EXPECT_TIMEOUT_MS` for its condition (its own default is
    5 s, which a page on a machine running four test processes on two cores does not always meet)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium package is not installed")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    with sync_playwright() as p:
        browsers = Chromium(p)
        try:
            yield browsers
        finally:
            browsers.close()


class Sites:
    """Seeded SQLite databases for the site, each seed applied once per pytest process, and daphne on them."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._templates: dict[tuple[str, tuple[tuple[str, str], ...]], Path] = {}

    def _env(self, database: Path, variables: Mapping[str, str]) -> dict[str, str]:
        return site_env(DEBUG="1", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1",
                        DATABASE_URL=f"sqlite:///{database}", **variables)

    def _template(self, seed: str, variables: Mapping[str, str]) -> Path:
        key = (seed, tuple(sorted(variables.items())))
        if key in self._templates:
            return self._templates[key]
        if not seed and not variables:
            path = self._directory / "migrated.db"
            done = run_manage("migrate", "--no-input", env=self._env(path, {}), timeout=300)
            assert done.returncode == 0, done.stderr
        else:
            path = self._directory / f"seeded-{len(self._templates)}.db"
            copy_database(self._template("", {}), path)
            done = run_manage("shell", "-c", seed, env=self._env(path, variables), timeout=300)
            assert done.returncode == 0, done.stderr
        self._templates[key] = path
        return path

    def database(self, target: Path, seed: str = "", **variables: str) -> Path:
        """A migrated database at ``target`` holding what ``seed`` (Python for ``manage.py shell``, run with
        ``variables`` in the site's environment) writes; returns ``target``."""
        copy_database(self._template(seed, variables), target)
        return target

    @contextlib.contextmanager
    def running(self, directory: Path, seed: str = "", seed_variables: Mapping[str, str] | None = None,
                **variables: str) -> Iterator[str]:
        """daphne serving the site on ``directory / "site.db"``, a copy of the database ``seed`` makes (see
        :meth:`database`); ``variables`` are added to the server's environment (e.g. ``REDIS_URL``). Yields
        the base URL; the server's log is printed afterwards (pytest shows it when the test failed)."""
        database = self.database(directory / "site.db", seed, **(seed_variables or {}))
        env = self._env(database, {**(seed_variables or {}), **variables})
        port = free_port()
        log = directory / "daphne.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatflow_site.asgi:application"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for_http(f"{base}/healthz/", timeout=60, proc=proc)
            yield base
        finally:
            stop(proc)
            print(f"--- the site's log ({log}), last lines ---")
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))


@pytest.fixture(scope="session")
def sites(tmp_path_factory) -> Sites:
    """The process's :class:`Sites` (its templates live in a temporary directory of the session)."""
    return Sites(tmp_path_factory.mktemp("site-templates"))
