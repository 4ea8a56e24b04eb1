"""The requirement files: production needs in requirements.txt, test and development tools in
requirements-dev.txt, and requirements-dev.lock pinning (with hashes) a release each of them allows."""

from __future__ import annotations

import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.processes import REPO

# Tools the suite and the developer use; a production install of the site carries none of them.
DEVELOPMENT_TOOLS = {"pytest", "pytest-django", "pytest-asyncio", "pytest-xdist", "playwright", "hypothesis", "mypy",
                     "ruff", "uv", "anthropic", "google-genai", "opentelemetry-sdk"}


def requirements(name: str) -> list[Requirement]:
    """The requirements a file lists (its ``-r`` includes not followed)."""
    lines = (line.split(" #", 1)[0].strip() for line in (REPO / name).read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith(("#", "-"))]


def pins(name: str) -> dict[str, list[tuple[str, str]]]:
    """The lock's pins: package name to (version, marker) pairs, each with its hashes checked present."""
    text = (REPO / name).read_text(encoding="utf-8")
    found: dict[str, list[tuple[str, str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2]):
        requirement = entry.split(" \\", 1)[0]
        assert "--hash=sha256:" in entry, f"{requirement} has no hash"
        spec, _, marker = requirement.partition(" ; ")
        package, version = spec.split("==")
        found.setdefault(canonicalize_name(package), []).append((version, marker))
    return found


def test_production_requirements_carry_no_development_tool():
    listed = {canonicalize_name(r.name) for r in requirements("requirements.txt")}

    assert listed.isdisjoint(DEVELOPMENT_TOOLS), listed & DEVELOPMENT_TOOLS


def test_the_development_requirements_include_the_production_ones_and_the_tools():
    text = (REPO / "requirements-dev.txt").read_text(encoding="utf-8")
    listed = {canonicalize_name(r.name) for r in requirements("requirements-dev.txt")}

    assert "-r requirements.txt" in text.splitlines()
    assert DEVELOPMENT_TOOLS <= listed, DEVELOPMENT_TOOLS - listed


def test_the_lock_pins_a_release_every_requirement_allows():
    locked = pins("requirements-dev.lock")

    for requirement in requirements("requirements.txt") + requirements("requirements-dev.txt"):
        versions = [version for version, _ in locked.get(canonicalize_name(requirement.name), [])]
        assert versions, f"{requirement.name} is not in requirements-dev.lock: run python3 dev.py lock"
        assert any(requirement.specifier.contains(v, prereleases=True) for v in versions), (
            f"requirements-dev.lock pins {requirement.name} {versions}, outside {requirement.specifier}: "
            "run python3 dev.py lock")


def test_the_packages_site_extra_and_requirements_txt_list_the_same_requirements():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["site"]]

    def key(requirement: Requirement) -> tuple[str, str, str]:
        return canonicalize_name(requirement.name), str(requirement.specifier), str(requirement.marker or "")

    assert sorted(map(key, declared)) == sorted(map(key, requirements("requirements.txt")))
