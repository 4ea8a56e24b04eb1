"""Layering rules that hold for the whole tree (ARCHITECTURE.md › Layers)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Production code outside the runtime: the Django site and its apps, the benchmarks, the entry points.
OUTSIDE_THE_RUNTIME = ["agents_app", "api_app", "chatflow_site", "sessions_app", "turns_app", "webhooks_app", "bench",
                       "manage.py", "dev.py"]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from chatflow_agent.core import _persistent`` imports a private module too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _private_runtime_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "chatflow_agent" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _production_files() -> list[Path]:
    files: list[Path] = []
    for entry in OUTSIDE_THE_RUNTIME:
        path = REPO / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_nothing_outside_the_runtime_imports_its_private_modules() -> None:
    files = _production_files()
    assert len(files) > 50  # the walk found the apps
    offenders = [f"{path.relative_to(REPO)}:{line}: {name}"
                 for path in files for line, name in _imported_modules(path) if _private_runtime_module(name)]
    assert offenders == []


def test_the_check_recognises_private_runtime_imports() -> None:
    assert _private_runtime_module("chatflow_agent.core._persistent")
    assert _private_runtime_module("chatflow_agent._jsonsafe")
    assert not _private_runtime_module("chatflow_agent.core.backend")
    assert not _private_runtime_module("chatflow_agent.__version__")
    assert not _private_runtime_module("sessions_app._private")
