"""The product documentation (``docs/*.md``) as console pages, for logged-in console users.

Markdown is rendered by markdown-it-py in CommonMark mode with raw HTML off: any HTML in a page is shown
as text, and its link check drops ``javascript:``, ``vbscript:``, ``file:`` and ``data:`` URLs. Links
between the pages (``operations.md#dashboard``) become console URLs, and headings get GitHub's ids, so
an anchor works both on the repository's pages and here.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET
from markdown_it import MarkdownIt

from sessions_app.access import console_required

DOCS_DIR = Path(settings.BASE_DIR) / "docs"
#: The pages in reading order (file name without ``.md``); a test checks that every file of docs/ is here.
PAGES = ("operator-guide", "webhooks", "operations", "api", "configuration", "performance")
_PAGE_LINK = re.compile(r"^(?:\./)?(?P<page>[a-z0-9-]+)\.md(?P<anchor>#[^\s]*)?$")


def heading_id(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _link_target(href: str) -> str:
    """A link between docs pages as its console URL; the README's link as the docs index; others as they are."""
    match = _PAGE_LINK.match(href)
    if match and match["page"] in PAGES:
        return reverse("docs-show-page", args=[match["page"]]) + (match["anchor"] or "")
    if href in ("../README.md", "README.md"):
        return reverse("docs-list-pages")
    return href


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "typographer": False}).enable("table")

    def heading_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
        inline = tokens[idx + 1]
        text = "".join(child.content for child in inline.children or [] if child.type in ("text", "code_inline"))
        tokens[idx].attrSet("id", heading_id(text))
        return str(renderer.renderToken(tokens, idx, options, env))

    def link_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        token.attrSet("href", _link_target(str(token.attrGet("href") or "")))
        return str(renderer.renderToken(tokens, idx, options, env))

    def focusable(rule: str) -> Any:
        """A block that scrolls sideways on a narrow screen, reachable with the keyboard (tabindex)."""
        default = md.renderer.rules[rule]

        def render(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
            return str(default(tokens, idx, options, env)).replace("<pre>", '<pre tabindex="0">', 1)

        return render

    def table_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("tabindex", "0")
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("heading_open", heading_open)
    md.add_render_rule("link_open", link_open)
    md.add_render_rule("fence", focusable("fence"))
    md.add_render_rule("code_block", focusable("code_block"))
    md.add_render_rule("table_open", table_open)
    return md


def render_markdown(text: str) -> SafeString:
    """``text`` as HTML, every raw HTML tag in it escaped and unsafe link schemes dropped."""
    return mark_safe(_markdown().render(text))  # raw HTML is off: markdown-it escaped it


@functools.lru_cache(maxsize=32)
def _rendered(page: str, modified_ns: int) -> tuple[str, SafeString]:
    text = (DOCS_DIR / f"{page}.md").read_text(encoding="utf-8")
    first = text.split("\n", 1)[0]
    title = first[2:].strip() if first.startswith("# ") else page
    return title, render_markdown(text)


def _page(page: str) -> tuple[str, SafeString]:
    path = DOCS_DIR / f"{page}.md"
    if page not in PAGES or not path.is_file():
        raise Http404(f"There is no documentation page {page!r}.")
    return _rendered(page, path.stat().st_mtime_ns)


@require_GET
@console_required()
def list_pages(request: HttpRequest) -> HttpResponse:
    """The documentation's contents: each page's title, in reading order."""
    pages = [(page, _page(page)[0]) for page in PAGES if (DOCS_DIR / f"{page}.md").is_file()]
    return render(request, "docs/index.html", {"pages": pages})


@require_GET
@console_required()
def show_page(request: HttpRequest, page: str) -> HttpResponse:
    """One documentation page; 404 for a name that is not one of the pages."""
    title, html = _page(page)
    pages = [(name, _page(name)[0]) for name in PAGES if (DOCS_DIR / f"{name}.md").is_file()]
    ctx = {"title": title, "html": html, "page": page, "pages": pages}
    return render(request, "docs/page.html", ctx)
