"""The README stays a set-up guide: small, with the two commands, and a way to every docs page; the links
between the README and the docs pages lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from chatflow_site.docs import heading_id

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
LIMIT_BYTES = 25 * 1024
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"(?s)```.*?```", "", path.read_text(encoding="utf-8"))
    return [href for href in LINK.findall(text) if not href.startswith(("http://", "https://", "mailto:"))]


def _anchors(path: Path) -> set[str]:
    return {heading_id(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines()
            if re.match(r"#{1,6} ", line)}


def test_the_readme_is_at_most_25_kb() -> None:
    assert len(README.read_bytes()) <= LIMIT_BYTES


def test_the_readme_gives_the_two_commands_ci_runs_the_test_one() -> None:
    text = README.read_text(encoding="utf-8")
    assert "```sh\npython3 dev.py serve\n```" in text
    assert "```sh\npython3 dev.py test\n```" in text
    assert "python3 dev.py test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readme_links_every_docs_page() -> None:
    linked = {href.split("#")[0] for href in _links(README)}
    assert {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")} <= linked


def test_every_relative_link_of_the_readme_and_the_docs_leads_to_a_file_and_heading() -> None:
    broken = []
    for source in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for href in _links(source):
            target, _, anchor = href.partition("#")
            path = (source.parent / target).resolve() if target else source
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
                broken.append(f"{source.relative_to(REPO)}: {href}")
    assert broken == []
