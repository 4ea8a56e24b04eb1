"""The runtime as a bot team installs it: the checkout's wheel in a fresh virtualenv, without the site.

The wheel is built from a copy of what pyproject.toml packages (so the checkout gets no build output) with
the project's own build backend and no build isolation; installing it fetches only the runtime's own
dependencies. The fresh virtualenv then runs a turn on ``SQLiteSessionStore`` with the scripted engine, away
from the checkout, and must not be able to import Django or Channels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.processes import REPO

pytestmark = pytest.mark.slow

PACKAGED = ("pyproject.toml", "LICENSE", "README.md", "chatflow_agent")

A_TURN_IN_THE_FRESH_VENV = """
import asyncio, importlib.metadata, importlib.util, json, sys
import chatflow_agent
from chatflow_agent import Agent, Runner, SQLiteSessionStore
from chatflow_agent.core.engines import ScriptedEngine

async def main():
    store = SQLiteSessionStore(sys.argv[1])
    runner = Runner(Agent(name="Support", instructions="Help."), session_store=store,
                    engine=ScriptedEngine("Your order A-1001 ships today."))
    reply = await runner.run_async("+15550100", "Where is order A-1001?")
    store.close()
    reopened = SQLiteSessionStore(sys.argv[1])
    history = [m.content for m in reopened.get("+15550100").history]
    reopened.close()
    return reply.content, history

answer, history = asyncio.run(main())
print(json.dumps({
    "file": chatflow_agent.__file__,
    "version": chatflow_agent.__version__,
    "answer": answer,
    "history": history,
    "importable": {name: importlib.util.find_spec(name) is not None for name in ("django", "channels", "daphne")},
    "requires": importlib.metadata.requires("chatflow-agent") or [],
}))
"""


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in PACKAGED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
          "--wheel-dir", str(dist), str(source)])
    (wheel,) = dist.glob("chatflow_agent-*.whl")
    return wheel


def test_the_wheel_installs_the_runtime_alone_and_plays_a_turn(tmp_path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        packaged = {name for name in archive.namelist() if name.startswith("chatflow_agent/")}
    in_checkout = {path.relative_to(REPO).as_posix() for path in (REPO / "chatflow_agent").rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts}
    assert packaged == in_checkout  # every module, and py.typed, and nothing else

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)])

    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "DJANGO"))}
    proc = _run([str(python), "-c", A_TURN_IN_THE_FRESH_VENV, str(away / "bot.db")], cwd=away, env=env)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    assert Path(seen["file"]).is_relative_to(venv)  # the installed package, not the checkout
    assert seen["answer"] == "Your order A-1001 ships today."
    assert seen["history"] == ["Where is order A-1001?", "Your order A-1001 ships today."]
    assert seen["importable"] == {"django": False, "channels": False, "daphne": False}
    base = [req for req in seen["requires"] if "extra ==" not in req]
    assert sorted(req.split(">")[0].split("<")[0].split("[")[0].strip() for req in base) == \
        ["genai-prices", "httpx", "openai", "pydantic"]


def test_the_distribution_replaces_chatflow_agent_0_3_4() -> None:
    """Same distribution name and a higher version, so pip upgrades 0.3.4 instead of writing over its files."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    import chatflow_agent

    assert project["name"] == "chatflow-agent"
    assert tuple(int(part) for part in chatflow_agent.__version__.split(".")[:3]) > (0, 3, 4)
    site = " ".join(project["optional-dependencies"]["site"])
    assert "Django" in site and "channels" in site
    assert not any(dep.lower().startswith(("django", "channels")) for dep in project["dependencies"])
