"""`python3 dev.py serve` on a clean copy of the repository: it migrates, prints an operator login and serves."""

from __future__ import annotations

import http.cookiejar
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from tests.processes import REPO, free_port, site_env, stop, wait_for_http

pytestmark = pytest.mark.slow


def clean_copy(target):
    """The files git would ship (tracked and new, not ignored), with the checkout's .venv linked in."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(REPO / ".venv")  # a fresh venv is CI's job: it runs dev.py in a fresh clone


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
