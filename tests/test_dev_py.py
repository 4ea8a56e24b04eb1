"""`python3 dev.py serve` on a clean copy of the repository: it migrates, prints an operator login and serves."""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.processes import REPO, free_port, site_env, stop, wait_for_http

pytestmark = pytest.mark.slow


def clean_copy(target, venv: bool = True):
    """The files git would ship (tracked and new, not ignored), with the checkout's .venv linked in
    (``venv``)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    if venv:  # a fresh venv is CI's job: it runs dev.py in a fresh clone
        (target / ".venv").symlink_to(REPO / ".venv")


def start_serve(copy, port):
    return subprocess.Popen(
        [sys.executable, "dev.py", "serve", "--port", str(port)],
        cwd=copy, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


def read_until_serving(proc) -> str:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "serving on" in line:
            return "".join(lines)
    raise AssertionError("dev.py serve exited early:\n" + "".join(lines))


def log_in(base: str, username: str, password: str) -> str:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = opener.open(f"{base}/accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"}
    ).encode()
    return opener.open(f"{base}/accounts/login/", data=form, timeout=10).geturl()


def test_serve_bootstraps_a_clean_copy_prints_an_operator_login_and_answers(tmp_path):
    copy = tmp_path / "checkout"
    clean_copy(copy)
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    proc = start_serve(copy, port)
    try:
        output = read_until_serving(proc)
        assert wait_for_http(f"{base}/healthz/", timeout=60, proc=proc) == b"ok"
        password = re.search(r"username operator\s+password (\S+)", output).group(1)
        assert log_in(base, "operator", password).endswith("/admin/")
    finally:
        stop(proc)
        proc.stdout.close()
    assert (copy / "var" / "chatflow.db").exists()

    proc = start_serve(copy, port)  # a second start migrates nothing new and shows the same login
    try:
        again = read_until_serving(proc)
        assert f"password {password}" in again
        assert wait_for_http(f"{base}/healthz/", timeout=60, proc=proc) == b"ok"
    finally:
        stop(proc)
        proc.stdout.close()


def venv_of_the_checkout(copy) -> None:
    """``copy/.venv``: a virtualenv over the checkout's installed packages, marked as having ``copy``'s
    requirements-dev.lock installed, so ``dev.py`` goes straight to the site's commands (and never installs)."""
    import hashlib

    venv = copy / ".venv"
    real = (REPO / ".venv").resolve()
    (venv / "bin").mkdir(parents=True)
    shutil.copy(real / "pyvenv.cfg", venv / "pyvenv.cfg")
    (venv / "bin" / "python").symlink_to(Path(os.path.realpath(real / "bin" / "python")))
    (venv / "lib").symlink_to(real / "lib")
    digest = hashlib.sha256((copy / "requirements-dev.lock").read_bytes()).hexdigest()
    (venv / ".requirements.sha256").write_text(digest + "\n")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(c) for c in task.read_text().split()]
    return found


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie whose parent is gone waits for init to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_ctrl_c_while_serve_bootstraps_stops_it_with_one_line(tmp_path):
    """Ctrl+C (SIGINT to the terminal's foreground process group) while a bootstrap command runs: dev.py
    stops it and says so in one line, with no traceback from dev.py or from the command."""
    copy = tmp_path / "checkout"
    clean_copy(copy, venv=False)
    venv_of_the_checkout(copy)
    # The bootstrap's first command (manage.py migrate) runs until it is stopped: the signal always finds it
    # running, however slow the machine is between seeing it start and sending the signal.
    (copy / "manage.py").write_text("import time\ntime.sleep(120)\n", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "dev.py", "serve", "--port", str(free_port())],
        cwd=copy, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # dev.py's group stands for the terminal's foreground group
        # As in a terminal's foreground: Ctrl+C not ignored, even when the suite itself runs in the background
        # (a shell starts background jobs with SIGINT ignored, and a process inherits that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        while not (running := children(proc.pid)) and proc.poll() is None:
            time.sleep(0.05)
        assert running, "dev.py serve ended before it ran a bootstrap command"
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert "Traceback" not in output, output
    assert output.strip().splitlines()[-1] == "[dev] stopped (Ctrl+C) before the server started", output
    assert proc.returncode == 130
    assert not any(alive(pid) for pid in running)  # the command was stopped too
