"""The ASGI application under daphne with DEBUG off: HTTP answers, static files are served (ServeStatic)."""

import secrets
import subprocess
import sys
import urllib.request

import pytest
from channels.routing import ProtocolTypeRouter

from tests.processes import REPO, free_port, site_env, stop, wait_for_http


def test_the_asgi_application_routes_http_and_websockets():
    from chatflow_site.asgi import application

    assert isinstance(application, ProtocolTypeRouter)
    assert set(application.application_mapping) == {"http", "websocket"}


@pytest.mark.slow
def test_daphne_serves_pages_and_static_files_with_debug_off(tmp_path):
    port = free_port()
    env = site_env(
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1",
        SECURE_SSL_REDIRECT="0",
        DATABASE_URL=f"sqlite:///{tmp_path / 'site.db'}",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatflow_site.asgi:application"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for_http(f"{base}/healthz/", timeout=30, proc=proc) == b"ok"
        with urllib.request.urlopen(f"{base}/static/css/console.css", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/css")
            assert b"--accent" in response.read()
        with urllib.request.urlopen(f"{base}/static/django_htmx/htmx-2.min.js", timeout=5) as response:
            assert response.status == 200
    finally:
        stop(proc)
        proc.stderr.close()
