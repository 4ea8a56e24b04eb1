#!/usr/bin/env python3
"""The two developer commands, runnable with nothing but python3 >= 3.11 (standard library only).

    python3 dev.py serve [--host 127.0.0.1] [--port 8000]
        create .venv if missing, install requirements.txt when it changed, migrate, seed demo data
        once, create the development operator account (DEBUG only) and serve with daphne.

    python3 dev.py test [PYTEST ARGS...]
        same bootstrap, Debian's chromium for the browser tests, PostgreSQL and Redis started if
        they are down; then the whole suite on SQLite and the Django tests again on PostgreSQL.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ROOT / "requirements.txt"
STAMP = VENV / ".requirements.sha256"
ARTIFACTS = ROOT / "test-artifacts"
POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/test"
# Tests of the framework-free runtime do not touch Django's database: they run once, on SQLite.
RUNTIME_ONLY_TESTS = "tests/chatflow_agent"


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def die(message: str, code: int = 2) -> None:
    print(f"[dev] error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd: list[str | Path], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, **kwargs)


def as_root(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo"):
        return ["sudo", "-n", *cmd]
    return cmd


# ---- bootstrap -----------------------------------------------------------------------------
def ensure_venv() -> None:
    """.venv exists and has requirements.txt installed (re-installed whenever the file's hash changes)."""
    if not PYTHON.exists():
        say("creating .venv")
        if run([sys.executable, "-m", "venv", VENV]).returncode != 0:
            package = f"python3.{sys.version_info.minor}-venv"
            if shutil.which("apt-get"):
                say(f"venv needs Debian's {package}; installing it")
                shutil.rmtree(VENV, ignore_errors=True)
                run(as_root(["apt-get", "install", "-y", package]))
            if run([sys.executable, "-m", "venv", VENV]).returncode != 0:
                die(f"could not create .venv (on Debian/Ubuntu: apt-get install {package})")
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text().strip() != digest:
        say("installing requirements.txt into .venv")
        pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
        if run([*pip, "-r", REQUIREMENTS]).returncode != 0:
            die("pip install -r requirements.txt failed")
        STAMP.write_text(digest + "\n")


def manage(*args: str, env: dict[str, str] | None = None) -> None:
    if run([PYTHON, "manage.py", *args], env=env).returncode != 0:
        die(f"manage.py {' '.join(args)} failed")


# ---- serve ---------------------------------------------------------------------------------
def serve(host: str, port: int) -> None:
    ensure_venv()
    manage("migrate", "--noinput", "-v", "0")
    manage("chatflow_demo", "--if-empty")
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


def counts(junit: Path) -> tuple[int, int]:
    """(passed, failed) from a pytest JUnit XML report; failures include errors."""
    if not junit.exists():
        return 0, 0
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed


def pytest_run(label: str, database_url: str, extra: list[str]) -> tuple[int, int, int]:
    junit = ARTIFACTS / f"junit-{label}.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL="", CHATFLOW_ENV_FILE="", PYTHONDONTWRITEBYTECODE="1")
    say(f"pytest on {label}")
    code = run([PYTHON, "-m", "pytest", f"--junitxml={junit}", *extra], env=env).returncode
    passed, failed = counts(junit)
    if code != 0 and failed == 0:
        failed = 1  # pytest stopped before reporting (collection error, usage error, no tests)
    return code, passed, failed


def test(pytest_args: list[str]) -> None:
    ensure_venv()
    ensure_chromium()
    ensure_services()
    ARTIFACTS.mkdir(exist_ok=True)
    sqlite = pytest_run("sqlite", "", pytest_args)
    postgres = pytest_run("postgresql", POSTGRES_URL, [f"--ignore={RUNTIME_ONLY_TESTS}", *pytest_args])
    passed = sqlite[1] + postgres[1]
    failed = sqlite[2] + postgres[2]
    say(f"SQLite: {sqlite[1]} passed, {sqlite[2]} failed; PostgreSQL: {postgres[1]} passed, {postgres[2]} failed")
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(0 if sqlite[0] == 0 and postgres[0] == 0 else 1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="dev.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="bootstrap and serve on http://127.0.0.1:8000")
    serve_parser.add_argument("--host", default="127.0.0.1")
    serve_parser.add_argument("--port", type=int, default=8000)
    commands.add_parser("test", help="bootstrap and run the test suite on SQLite and PostgreSQL")
    args, rest = parser.parse_known_args()
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        serve(args.host, args.port)
    else:
        test(rest)


if __name__ == "__main__":
    main()
