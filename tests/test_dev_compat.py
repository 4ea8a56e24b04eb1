"""The 0.3.4 compatibility step of `python3 dev.py test`: its pytest plugin, its expected list, its download.

No test here reaches the network: the package index is a closed loopback port, the sdist a tarball built here.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import textwrap
import types

import pytest

import dev
from tests.processes import free_port

pytest_plugins = ["pytester"]

SAMPLE_TESTS = '''
import pytest
from chatflow_agent.exceptions import DependencyError


def test_passes():
    assert True


@pytest.mark.parametrize("n", [1, 2])
def test_differs(n):
    assert n == 0


@pytest.mark.parametrize("n", [1, 2])
def test_one_case_differs(n):
    assert n == 1


def test_needs_missing_sdk():
    raise DependencyError("Engine", "no_such_sdk_for_tests")


def test_needs_unlisted_sdk():
    raise DependencyError("Engine", "another_missing_sdk")


async def test_async_without_a_mark():
    assert True
'''

SAMPLE_EXPECTED = '''
[[xfail]]
reason = "we differ on purpose"
tests = ["test_sample.py::test_differs", "test_sample.py::test_one_case_differs[2]"]

[optional_packages]
no_such_sdk_for_tests = "the SDK is optional"
'''


def write_sample(pytester, expected=SAMPLE_EXPECTED):
    pytester.makepyfile(test_sample=SAMPLE_TESTS)
    pytester.makefile(".toml", expected=textwrap.dedent(expected))
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")


def run_plugin(pytester, *args):
    """pytest, in this process, with the plugin on the sample; its own ini, so none of the suite's settings."""
    return pytester.runpytest_inprocess(
        "-p", "no:django", "-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "tests.upstream_compat",
        f"--upstream-expected={pytester.path / 'expected.toml'}", "-rsx", *args,
    )


def test_listed_tests_are_strict_xfails_with_their_reason_and_missing_optional_sdks_skip(pytester):
    write_sample(pytester)
    result = run_plugin(pytester, "-v")
    result.assert_outcomes(passed=3, xfailed=3, skipped=1, failed=1)
    result.stdout.fnmatch_lines_random([
        "*::test_differs[[]1[]] XFAIL*",
        "*::test_differs[[]2[]] XFAIL*",  # an id without [...] covers every case
        "*::test_one_case_differs[[]1[]] PASSED*",
        "*::test_one_case_differs[[]2[]] XFAIL*",
        "XFAIL test_sample.py::test_differs[[]1[]] - we differ on purpose",
        "SKIPPED [[]1[]] *: the SDK is optional",
        "*::test_needs_unlisted_sdk FAILED*",  # only the listed optional packages skip
        "*::test_async_without_a_mark PASSED*",
    ])


def test_a_listed_test_that_passes_fails_the_run(pytester):
    write_sample(pytester, expected='[[xfail]]\nreason = "r"\ntests = ["test_sample.py::test_passes"]\n')
    result = run_plugin(pytester, "-k", "test_passes")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]XPASS(strict)[]] r*"])


def test_an_id_that_names_no_collected_test_stops_the_run(pytester):
    write_sample(pytester, expected=SAMPLE_EXPECTED.replace("::test_differs", "::test_gone"))
    result = run_plugin(pytester, "-k", "test_passes")  # deselection does not hide the stale id
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*stale list*", "  test_sample.py::test_gone"])
    result.stderr.no_fnmatch_line("*test_one_case_differs*")


def test_the_run_stops_unless_chatflow_agent_is_this_repositorys(pytester, monkeypatch, tmp_path):
    write_sample(pytester)
    foreign = types.ModuleType("chatflow_agent")
    foreign.__file__ = str(tmp_path / "site-packages" / "chatflow_agent" / "__init__.py")
    monkeypatch.setitem(sys.modules, "chatflow_agent", foreign)
    result = run_plugin(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*chatflow_agent was imported from {foreign.__file__}, not from this repository*"])


@pytest.fixture
def compat_only(monkeypatch, tmp_path, capsys):
    """``dev.test([], compat_only=True)`` with the cache in tmp_path/cache and pip's index a closed loopback port,
    with no cache, proxy, config file or retry to fall back on; returns (exit status, output)."""
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple/")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("NO_PROXY", "*")
    monkeypatch.setattr(dev, "ensure_venv", lambda: None)  # the shared venv is never reinstalled by a test
    monkeypatch.setattr(dev, "ARTIFACTS", tmp_path)
    monkeypatch.setattr(dev, "UPSTREAM_CACHE", tmp_path / "cache")

    def run() -> tuple[int, str]:
        with pytest.raises(SystemExit) as exit_info:
            dev.test([], compat_only=True)
        return exit_info.value.code, capsys.readouterr().out

    return run


@pytest.mark.slow
def test_a_failed_download_is_reported_as_skipped_not_passed_nor_failed(compat_only):
    code, out = compat_only()
    lines = out.splitlines()
    line = next(line for line in lines if "0.3.4 compatibility" in line)
    assert line.startswith("[dev] 0.3.4 compatibility: SKIPPED — could not download chatflow-agent 0.3.4 (")
    assert "ERROR" in line  # pip's own reason
    assert lines[-1] == "0 passed, 0 failed"
    assert code == 0


def fake_sdist(path, tests: str) -> str:
    """A tarball laid out like 0.3.4's sdist (package in src/, tests in tests/); returns its sha256."""
    prefix = f"chatflow_agent-{dev.UPSTREAM_VERSION}/"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in (("src/chatflow_agent/__init__.py", "raise ImportError('not ours')\n"),
                           ("tests/__init__.py", ""), ("tests/test_sample.py", tests)):
            data = text.encode()
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_cached_sdist_runs_offline_and_its_counts_and_failures_reach_the_summary(compat_only, tmp_path, monkeypatch):
    (tmp_path / "expected.toml").write_text(textwrap.dedent(SAMPLE_EXPECTED))
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(dev, "UPSTREAM_SHA256", fake_sdist(cache / dev.UPSTREAM_SDIST, SAMPLE_TESTS))
    monkeypatch.setattr(dev, "UPSTREAM_TESTS", ("test_sample",))
    monkeypatch.setattr(dev, "UPSTREAM_EXPECTED", tmp_path / "expected.toml")

    code, out = compat_only()

    assert "[dev] 0.3.4 compatibility: 3 passed, 3 xfailed, 1 skipped, 1 failed" in out.splitlines()
    assert out.splitlines()[-1] == "3 passed, 1 failed"
    assert code == 1
    assert sorted(p.name for p in cache.iterdir()) == [dev.UPSTREAM_SDIST, "tests"]  # the package stays packed
    assert [p.name for p in (cache / "tests").iterdir()] == ["test_sample.py"]
