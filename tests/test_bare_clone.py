"""A clone with nothing beside it (no ``../shared/``): the tests whose input lies outside the repository
skip with the reason, they do not error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import REPO, site_env

pytestmark = pytest.mark.slow

#: Test modules reading a file outside the repository (``REPO.parent``).
OUTSIDE = sorted(p.relative_to(REPO) for p in (REPO / "tests").rglob("test_*.py")
                 if "REPO.parent" in p.read_text(encoding="utf-8") and p.name != Path(__file__).name)


def bare_clone(root: Path) -> Path:
    """``root/clone``: the checkout's code linked in, the test modules copied (their paths resolve there)."""
    clone = root / "clone"
    clone.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {"tests", "var", ".git", ".venv"}:
            (clone / entry.name).symlink_to(entry)
    for module in ["tests/__init__.py", "tests/conftest.py", "tests/processes.py", "tests/browser_sites.py",
                   "tests/settings_reads.py", *map(str, OUTSIDE)]:
        (clone / module).parent.mkdir(parents=True, exist_ok=True)
        (clone / module).parent.joinpath("__init__.py").touch()
        shutil.copyfile(REPO / module, clone / module)
    return clone


def test_tests_reading_files_beside_the_repository_skip_when_those_are_absent(tmp_path):
    assert OUTSIDE, "no test module reads beside the repository any more: drop this test"
    clone = bare_clone(tmp_path)
    assert not (clone.parent / "shared").exists()
    env = site_env(PYTHONPATH=str(clone), DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *map(str, OUTSIDE), "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=clone, env={**env, "PWD": str(clone)}, capture_output=True, text=True, timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert " error" not in out and "passed" not in out, out
    assert "lies outside the repository and is absent here" in out and "skipped" in out, out
    assert os.fspath(clone.parent / "shared") in out, out
