"""pytest plugin that runs another release's tests against this repository's ``chatflow_agent``.

    python -m pytest -p tests.upstream_compat --upstream-expected=tests/upstream_034_expected.toml PATHS...

The expected file (TOML) lists where our package differs on purpose::

    [[xfail]]                  # any number of groups
    reason = "why we differ"
    tests = ["test_mod.py::test_name", "test_mod.py::test_name[param-id]"]

    [optional_packages]        # package name = reason
    anthropic = "why it is not installed"

Each listed test is marked ``xfail(strict=True, reason=...)`` at collection; an id without ``[...]``
covers every parametrization of the test. A listed id that names no collected test is a usage error
(pytest exits with status 4): the list is stale. A test that raises our ``DependencyError`` for a
package of ``optional_packages`` skips with that reason when the package is not installed.
The run stops at start-up (status 4) unless ``chatflow_agent`` is imported from this repository.
"""

from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Expected:
    """The contents of an expected file: ``xfails`` maps test id → reason, ``optional_packages`` name → reason."""

    xfails: dict[str, str]
    optional_packages: dict[str, str]


def load_expected(path: Path) -> Expected:
    """Parse an expected file; raises ``pytest.UsageError`` naming the file when it is unreadable or malformed."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        xfails: dict[str, str] = {}
        for group in data.get("xfail", []):
            reason = group["reason"]
            for test_id in group["tests"]:
                if test_id in xfails:
                    raise ValueError(f"{test_id} is listed twice")
                xfails[test_id] = str(reason)
        optional = {str(name): str(reason) for name, reason in data.get("optional_packages", {}).items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
        raise pytest.UsageError(f"expected-failures file {path}: {type(err).__name__}: {err}") from err
    return Expected(xfails, optional)


EXPECTED = pytest.StashKey[Expected]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--upstream-expected", metavar="TOML", help="file listing the intended differences (tests/upstream_compat.py)"
    )


def pytest_configure(config: pytest.Config) -> None:
    import chatflow_agent

    location = Path(chatflow_agent.__file__).resolve()
    if not location.is_relative_to(REPO):
        raise pytest.UsageError(f"chatflow_agent was imported from {location}, not from this repository ({REPO})")
    path = config.getoption("upstream_expected")
    if not path:
        raise pytest.UsageError("tests.upstream_compat needs --upstream-expected=TOML")
    config.stash[EXPECTED] = load_expected(Path(path))


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection: the stale check sees every collected test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xfails = config.stash[EXPECTED].xfails
    matched: set[str] = set()
    for item in items:
        name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
        exact = f"{item.path.name}::{name}"
        listed = [key for key in (exact, exact.split("[", 1)[0]) if key in xfails]
        if listed:
            matched.update(listed)
            item.add_marker(pytest.mark.xfail(strict=True, reason=xfails[listed[0]]))
    stale = sorted(set(xfails) - matched)
    if stale:
        raise pytest.UsageError(
            "expected failures that name no collected test (stale list):\n" + "\n".join(f"  {s}" for s in stale)
        )


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    from chatflow_agent.exceptions import DependencyError

    try:
        return (yield)
    except DependencyError as err:
        reason = pyfuncitem.config.stash[EXPECTED].optional_packages.get(err.extra_package)
        if reason is None or importlib.util.find_spec(err.extra_package) is not None:
            raise
        pytest.skip(reason)
