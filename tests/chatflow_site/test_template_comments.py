"""Django's ``{# … #}`` comment ends at its line: one spread over two lines is printed on the page."""

from __future__ import annotations

import pytest

from tests.processes import REPO

TEMPLATES = sorted((REPO / "templates").rglob("*.html")) + sorted(REPO.glob("*_app/templates/**/*.html"))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_one_line_comment_closes_on_its_line(path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        rest = line
        while "{#" in rest:
            rest = rest[rest.index("{#") + 2:]
            assert "#}" in rest, f"{path.relative_to(REPO)}:{number}: '{{#' without '#}}' on its line"
            rest = rest[rest.index("#}") + 2:]


@pytest.mark.django_db
def test_the_login_page_shows_no_template_syntax(client):
    body = client.get("/accounts/login/").content.decode()
    assert "{#" not in body and "#}" not in body
    assert body.index('name="htmx-config"') < body.index("<body")
