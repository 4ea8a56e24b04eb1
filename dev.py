#!/usr/bin/env python3
"""The two developer commands, runnable with nothing but python3 >= 3.11 (standard library only).

    python3 dev.py serve [--host 127.0.0.1] [--port 8000]
        create .venv if missing, install requirements-dev.lock when it changed, migrate, seed demo
        data once, create the development operator account (DEBUG only) and serve with daphne.

    python3 dev.py test [PYTEST ARGS...]
        same bootstrap, Debian's chromium for the browser tests, PostgreSQL and Redis started if
        they are down; ruff check with the project's rules; then two pytest passes side by side:
        every test on SQLite, and the tests that use Django's test database on PostgreSQL; then
        chatflow-agent 0.3.4's own runtime tests against our package (compatibility step). The
        last line is "N passed, N failed" (the lint counts as one); the exit status is 0 only
        when every step passed.

    python3 dev.py test --compat-only
        the bootstrap and the compatibility step alone.

    python3 dev.py lock [--upgrade]
        refresh requirements-dev.lock (every package the suite runs with, pinned with hashes) from
        requirements.txt and requirements-dev.txt after editing them; pins still allowed stay
        unless --upgrade is given. Commit the lock with the requirement change.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
# The site's and runtime's requirements (requirements.txt) with the test and development tools.
REQUIREMENTS = ROOT / "requirements-dev.txt"
LOCK = ROOT / "requirements-dev.lock"
STAMP = VENV / ".requirements.sha256"
ARTIFACTS = ROOT / "test-artifacts"
POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/test"
# pytest-xdist workers of each test pass (two passes run at once).
PASS_WORKERS = 2
NO_TESTS_COLLECTED = 5  # pytest's exit status when the selection holds no test
# Compatibility step: chatflow-agent 0.3.4's session, runner, agent, tool and type tests, run against our package.
UPSTREAM_VERSION = "0.3.4"
UPSTREAM_SDIST = f"chatflow_agent-{UPSTREAM_VERSION}.tar.gz"
UPSTREAM_SHA256 = "53ba736a7dc2af7e4906b2eaef284ebe05cbeea3c5ce2e6f5200961ede1db913"  # the index's file, pinned
UPSTREAM_CACHE = ROOT / "var" / f"upstream-{UPSTREAM_VERSION}"
UPSTREAM_EXPECTED = ROOT / "tests" / "upstream_034_expected.toml"
UPSTREAM_TESTS = (
    "test_agent", "test_engine_credentials", "test_memory", "test_memory_integrity", "test_memory_sqlite",
    "test_multi_engine", "test_runner", "test_runner_rollback", "test_runner_security", "test_tools", "test_types",
)


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def die(message: str, code: int = 2) -> None:
    print(f"[dev] error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd: list[str | Path], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, **kwargs)


def step(cmd: list[str | Path], env: dict[str, str] | None = None) -> int:
    """Run a bootstrap command and return its exit status. It runs in a process group of its own: Ctrl+C
    in the terminal (which signals its foreground group) reaches dev.py alone, which stops the command with
    SIGTERM (no traceback from it) and leaves with one line (``main``)."""
    # Ctrl+C is held back while the command starts, so it always finds ``proc`` to stop (never a child it
    # cannot name, left running); the command itself starts with the usual mask.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, process_group=0,
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held))
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl+C that came meanwhile is raised here
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def as_root(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo"):
        return ["sudo", "-n", *cmd]
    return cmd


# ---- bootstrap -----------------------------------------------------------------------------
def ensure_venv() -> None:
    """.venv exists and has requirements-dev.lock installed (re-installed whenever the lock's hash changes)."""
    if not PYTHON.exists():
        say("creating .venv")
        if step([sys.executable, "-m", "venv", VENV]) != 0:
            package = f"python3.{sys.version_info.minor}-venv"
            if shutil.which("apt-get"):
                say(f"venv needs Debian's {package}; installing it")
                shutil.rmtree(VENV, ignore_errors=True)
                run(as_root(["apt-get", "install", "-y", package]))
            if step([sys.executable, "-m", "venv", VENV]) != 0:
                die(f"could not create .venv (on Debian/Ubuntu: apt-get install {package})")
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    # pip's own deprecation warnings are not ours to fail on (the tests start dev.py with warnings as errors).
    quiet = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if not LOCK.exists():  # before the first `dev.py lock`: the newest allowed releases, unpinned
        say(f"{LOCK.name} is missing; installing {REQUIREMENTS.name} into .venv")
        if step([*pip, "-r", REQUIREMENTS], env=quiet) != 0:
            die(f"pip install -r {REQUIREMENTS.name} failed")
        STAMP.unlink(missing_ok=True)
        return
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text().strip() != digest:
        say(f"installing {LOCK.name} into .venv")
        # Every line of the lock carries its hashes, so pip checks each download against them.
        if step([*pip, "--require-hashes", "-r", LOCK], env=quiet) != 0:
            die(f"pip install -r {LOCK.name} failed")
        STAMP.write_text(digest + "\n")


def lock(upgrade: bool) -> None:
    """Write requirements-dev.lock from requirements-dev.txt with uv (installed from the lock itself)."""
    ensure_venv()
    say(f"resolving {REQUIREMENTS.name} into {LOCK.name}")
    command = [
        PYTHON, "-m", "uv", "pip", "compile", "--quiet", REQUIREMENTS.name, "--output-file", LOCK.name,
        # Hashes of every file of each release, and markers kept: one lock for every platform and Python >= 3.11.
        "--generate-hashes", "--universal", "--python-version", "3.11",
        "--custom-compile-command", "python3 dev.py lock",
    ]
    if run([*command, *(["--upgrade"] if upgrade else [])]).returncode != 0:
        die(f"could not resolve {REQUIREMENTS.name}")
    ensure_venv()


def manage(*args: str) -> None:
    if step([PYTHON, "manage.py", *args]) != 0:
        die(f"manage.py {' '.join(args)} failed")


# ---- serve ---------------------------------------------------------------------------------
def serve(host: str, port: int) -> None:
    ensure_venv()
    manage("migrate", "--noinput", "-v", "0")
    manage("chatflow_demo", "--if-empty", "--takeover", "4")
    manage("chatflow_dev_operator", "--if-debug")
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    say(f"serving on {url}  (Ctrl+C stops)")
    daphne = VENV / "bin" / "daphne"
    os.chdir(ROOT)
    # exec: the server gets this process's id, so stopping `dev.py serve` stops the server.
    os.execv(daphne, [str(daphne), "-b", host, "-p", str(port), "chatflow_site.asgi:application"])


# ---- test ----------------------------------------------------------------------------------
def ensure_chromium() -> None:
    if Path("/usr/bin/chromium").exists():
        return
    if not shutil.which("apt-get"):
        say("warning: /usr/bin/chromium is missing and apt-get is not available; browser tests will fail")
        return
    say("installing Debian's chromium for the browser tests")
    run(as_root(["apt-get", "update", "-qq"]))
    if run(as_root(["apt-get", "install", "-y", "-qq", "chromium"])).returncode != 0:
        say("warning: apt-get install chromium failed; browser tests will fail")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def ensure_service(name: str, port: int, commands: list[list[str]]) -> None:
    """The service answers on 127.0.0.1:port, started with ``commands`` if it was down; else exit 2."""
    if port_open(port):
        return
    say(f"{name} is not running on 127.0.0.1:{port}; starting it")
    problems = []
    for cmd in commands:
        if not shutil.which(cmd[0]):
            problems.append(f"{cmd[0]} is not installed")
            continue
        result = run(as_root(cmd), capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(f"`{' '.join(cmd)}` exited {result.returncode}: {result.stderr.strip()[-300:]}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_open(port):
            return
        time.sleep(0.5)
    die(f"{name} is not running on 127.0.0.1:{port} and could not be started" + "".join(f"\n  - {p}" for p in problems))


def ensure_services() -> None:
    versions = sorted(p.name for p in Path("/etc/postgresql").glob("*")) if Path("/etc/postgresql").is_dir() else []
    ensure_service(
        "PostgreSQL",
        5432,
        [["pg_ctlcluster", "--skip-systemctl-redirect", v, "main", "start"] for v in versions]
        or [["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start"]],
    )
    if os.geteuid() == 0:  # redis-server refuses to start without its --dir and log folder
        for folder in ("/var/lib/redis", "/var/log/redis"):
            Path(folder).mkdir(parents=True, exist_ok=True)
    ensure_service(
        "Redis",
        6379,
        [["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
          "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]],
    )


class Outcome(NamedTuple):
    """One pytest run: exit status and counts; ``failed`` includes errors, ``skipped`` excludes xfailed."""

    code: int
    passed: int
    failed: int
    xfailed: int = 0
    skipped: int = 0


def outcome(code: int, junit: Path) -> Outcome:
    """The counts of a pytest JUnit XML report; a non-zero status with no failure reported counts one failure."""
    passed = failed = xfailed = skipped = 0
    if junit.exists():
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        tests = sum(int(s.get("tests", 0)) for s in suites)
        failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)  # xfailed tests are reported as skipped
        xfailed = sum(1 for skip in root.iter("skipped") if skip.get("type") == "pytest.xfail")
        passed = tests - failed - skipped
        skipped -= xfailed
    if code != 0 and failed == 0:
        failed = 1  # pytest stopped before reporting (collection error, usage error, no tests)
    return Outcome(code, passed, failed, xfailed, skipped)


def pytest_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a pytest run: the database, no Redis channel layer and no .env file."""
    return dict(os.environ, DATABASE_URL=database_url, REDIS_URL="", CHATFLOW_ENV_FILE="", PYTHONDONTWRITEBYTECODE="1",
                **extra)


def pytest_run(label: str, database_url: str, extra: list[str]) -> Outcome:
    junit = ARTIFACTS / f"junit-{label}.xml"
    junit.unlink(missing_ok=True)
    say(f"pytest on {label}")
    code = run([PYTHON, "-m", "pytest", f"--junitxml={junit}", *extra], env=pytest_env(database_url)).returncode
    return outcome(code, junit)


class Pass(NamedTuple):
    """One pytest process of the test command: its database, its selection and its own Redis databases."""

    label: str  # names its log and JUnit report in test-artifacts/
    title: str
    database_url: str
    options: list[str]
    workers: int  # pytest-xdist worker processes (0: the tests run in the pytest process itself)
    redis_dbs: str  # tests.processes takes three local Redis databases from this list per worker


def passes() -> list[Pass]:
    """On PostgreSQL, the tests that use Django's test database (conftest.py tells them apart) and the few runtime
    modules of ``tests.conftest.EVENED_OUT``; on SQLite, every other test. The two run at once, so each has its own
    Redis databases and cache."""
    return [
        Pass("sqlite", "SQLite", "", ["--not-evened-out"], PASS_WORKERS, "11,3,4,12,5,6"),
        Pass("postgresql", "PostgreSQL", POSTGRES_URL, ["--database-tests-only"], PASS_WORKERS, "13,7,8,14,1,2"),
    ]


class Started(NamedTuple):
    run: Pass
    proc: subprocess.Popen
    junit: Path
    log: Path
    began: float


def start_passes(runs: list[Pass], pytest_args: list[str]) -> list[Started]:
    """Start every pass in the background, its output going to test-artifacts/pytest-<label>.log."""
    started = []
    for one in runs:
        junit, log = ARTIFACTS / f"junit-{one.label}.xml", ARTIFACTS / f"pytest-{one.label}.log"
        junit.unlink(missing_ok=True)
        command = [PYTHON, "-m", "pytest", f"--junitxml={junit}", "-o", f"cache_dir=.pytest_cache/{one.label}",
                   *(["-n", str(one.workers), "--dist", "loadfile"] if one.workers else []), *one.options,
                   *pytest_args]
        say(f"pytest on {one.title} ({log.relative_to(ROOT)})")
        with log.open("w", encoding="utf-8") as out:
            proc = subprocess.Popen([str(c) for c in command], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    env=pytest_env(one.database_url, CHATFLOW_TEST_REDIS_DBS=one.redis_dbs))
        started.append(Started(one, proc, junit, log, time.monotonic()))
    return started


def finish_passes(started: list[Started], pytest_args: list[str]) -> list[Outcome]:
    """Wait for every pass and print each one's output in turn; their outcomes in the same order.

    A pass that selected no test counts as passed when ``pytest_args`` narrowed the selection (``-k``, a path):
    a selection of runtime tests has none that use the database.
    """
    results = []
    for one, proc, junit, log, began in started:
        code = proc.wait()
        seconds = time.monotonic() - began
        print(f"\n[dev] ---- pytest on {one.title} ----", flush=True)
        sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
        if code == NO_TESTS_COLLECTED and pytest_args:
            say(f"{one.title}: no test of this selection runs on it")
            results.append(Outcome(0, 0, 0))
            continue
        result = outcome(code, junit)
        say(f"{one.title}: {result.passed} passed, {result.failed} failed in {seconds:.0f} s")
        results.append(result)
    return results


def lint() -> Outcome:
    """``ruff check`` with the project's rules (pyproject.toml); it counts as one passed or failed test."""
    say("ruff check")
    code = run([PYTHON, "-m", "ruff", "check", "--no-cache", "."]).returncode
    say(f"ruff check: {'passed' if code == 0 else 'FAILED'}")
    return Outcome(code, int(code == 0), int(code != 0))


def fetch_upstream_tests(cache: Path) -> list[Path]:
    """0.3.4's test modules (UPSTREAM_TESTS) extracted from its sdist into ``cache / "tests"``.

    The sdist is downloaded with the venv's pip into ``cache`` unless it is already there with the pinned
    sha256. Only the test modules are extracted: the sdist's own package is never on disk to be imported.
    Raises ``ConnectionError`` (its text says why) when the download fails, ``ValueError`` when the file's
    sha256 is not the pinned one or a module is missing from it.
    """
    sdist = cache / UPSTREAM_SDIST
    if sdist.exists() and hashlib.sha256(sdist.read_bytes()).hexdigest() != UPSTREAM_SHA256:
        sdist.unlink()  # a partial or foreign file: download it again
    if not sdist.exists():
        say(f"downloading chatflow-agent {UPSTREAM_VERSION}'s sdist into {cache}")
        cache.mkdir(parents=True, exist_ok=True)
        result = run(
            [PYTHON, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:",
             f"chatflow-agent=={UPSTREAM_VERSION}", "-d", cache],
            capture_output=True, text=True,
        )
        if result.returncode != 0 or not sdist.exists():
            lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
            errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:] or [f"exit {result.returncode}"]
            index = [line for line in lines if line.startswith("Looking in indexes")][:1]
            raise ConnectionError("; ".join(errors[-1:] + index)[:400])
        if hashlib.sha256(sdist.read_bytes()).hexdigest() != UPSTREAM_SHA256:
            raise ValueError(f"{sdist} does not have the pinned sha256 {UPSTREAM_SHA256}")
    target = cache / "tests"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    prefix = f"chatflow_agent-{UPSTREAM_VERSION}/tests/"
    with tarfile.open(sdist) as archive:
        members = {m.name[len(prefix):]: m for m in archive.getmembers() if m.isfile() and m.name.startswith(prefix)}
        modules = []
        for name in UPSTREAM_TESTS:
            member = members.get(f"{name}.py")
            if member is None:
                raise ValueError(f"{UPSTREAM_SDIST} has no tests/{name}.py")
            (target / f"{name}.py").write_bytes(archive.extractfile(member).read())
            modules.append(target / f"{name}.py")
    return modules


def compatibility(cache: Path | None = None) -> Outcome | None:
    """Run 0.3.4's tests against our package; ``None`` (and a SKIPPED line) when they could not be downloaded.

    ``cache`` defaults to UPSTREAM_CACHE. Prints ``[dev] 0.3.4 compatibility: N passed, N xfailed, N skipped,
    N failed``.
    """
    cache = cache or UPSTREAM_CACHE
    label = f"{UPSTREAM_VERSION} compatibility"
    try:
        modules = fetch_upstream_tests(cache)
    except ConnectionError as err:
        say(f"{label}: SKIPPED — could not download chatflow-agent {UPSTREAM_VERSION} ({err})")
        return None
    except (ValueError, OSError, tarfile.TarError) as err:
        say(f"{label}: FAILED — {err}")
        return Outcome(1, 0, 1)
    result = pytest_run(
        f"upstream-{UPSTREAM_VERSION}",
        "",
        [
            # Our configuration (Django settings, warnings as errors, strict markers) wherever the cache is.
            "-c", str(ROOT / "pyproject.toml"), f"--rootdir={ROOT}",
            "-p", "tests.upstream_compat", f"--upstream-expected={UPSTREAM_EXPECTED}",
            # Written for pytest-asyncio's auto mode (their pyproject); ours is strict.
            "-o", "asyncio_mode=auto",
            # Import them without putting their folder on sys.path: only our chatflow_agent is importable.
            "--import-mode=importlib",
            *[str(m.relative_to(ROOT)) if m.is_relative_to(ROOT) else str(m) for m in modules],
        ],
    )
    say(f"{label}: {result.passed} passed, {result.xfailed} xfailed, {result.skipped} skipped, {result.failed} failed")
    return result


def test(pytest_args: list[str], compat_only: bool = False) -> None:
    ensure_venv()
    ARTIFACTS.mkdir(exist_ok=True)
    runs: list[Outcome] = []
    if not compat_only:
        ensure_chromium()
        ensure_services()
        runs.append(lint())
        both = passes()
        started = start_passes(both, pytest_args)
    compat = compatibility()  # in the foreground while the passes run
    if compat is not None:
        runs.append(compat)
    if not compat_only:
        results = finish_passes(started, pytest_args)
        say("; ".join(f"{one.title}: {r.passed} passed, {r.failed} failed"
                      for one, r in zip(both, results, strict=True)))
        runs += results
    print(f"{sum(r.passed for r in runs)} passed, {sum(r.failed for r in runs)} failed", flush=True)
    sys.exit(0 if all(r.code == 0 for r in runs) else 1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="dev.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="bootstrap and serve on http://127.0.0.1:8000")
    serve_parser.add_argument("--host", default="127.0.0.1")
    serve_parser.add_argument("--port", type=int, default=8000)
    # No abbreviations: a pytest option such as --co must reach pytest, not match --compat-only.
    test_parser = commands.add_parser(
        "test", help="bootstrap and run the test suite on SQLite and PostgreSQL", allow_abbrev=False
    )
    test_parser.add_argument("--compat-only", action="store_true", help="run only the 0.3.4 compatibility step")
    lock_parser = commands.add_parser("lock", help="refresh requirements-dev.lock from the requirement files")
    lock_parser.add_argument("--upgrade", action="store_true", help="move every pin to its newest allowed release")
    args, rest = parser.parse_known_args()
    if args.command in ("serve", "lock") and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "serve":
        try:
            serve(args.host, args.port)
        except KeyboardInterrupt:  # Ctrl+C before the server started: the bootstrap step was stopped
            print("[dev] stopped (Ctrl+C) before the server started", file=sys.stderr, flush=True)
            sys.exit(130)
    elif args.command == "lock":
        lock(args.upgrade)
    else:
        if args.compat_only and rest:
            parser.error(f"--compat-only takes no pytest arguments: {' '.join(rest)}")
        test(rest, compat_only=args.compat_only)


if __name__ == "__main__":
    main()
