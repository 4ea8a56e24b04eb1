"""sessions_app sits below webhooks_app in the app stack (ARCHITECTURE.md › Layers): none of its modules imports
webhooks_app, at module level or inside a function."""

from __future__ import annotations

from tests.test_architecture import REPO, _imported_modules


def test_no_sessions_app_module_imports_webhooks_app() -> None:
    files = sorted((REPO / "sessions_app").rglob("*.py"))
    assert len(files) > 20  # the walk found the app
    upward = [f"{path.relative_to(REPO)}:{line}: {name}" for path in files
              for line, name in _imported_modules(path) if name.split(".")[0] == "webhooks_app"]
    assert upward == []
