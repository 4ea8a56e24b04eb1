"""Telegram's 4,096 UTF-16 code unit split, and when the embedded worker starts."""

from __future__ import annotations

import re

import pytest

from webhooks_app import embedded
from webhooks_app.replies import split_message, utf16_len


def test_short_text_is_one_chunk():
    assert split_message("hello") == ["hello"]
    assert split_message("") == []


def test_chunks_fit_in_4096_utf16_units_and_rejoin_to_the_text():
    text = ("lorem ipsum dolor sit amet " * 400).strip()
    chunks = split_message(text)
    assert len(chunks) > 1 and all(utf16_len(c) <= 4096 for c in chunks)
    assert " ".join(c.strip() for c in chunks).split() == text.split()


def test_it_never_splits_a_surrogate_pair():
    text = "a" + "😀" * 3000  # 6,001 UTF-16 units; an odd offset puts a naive cut inside a pair
    chunks = split_message(text)
    assert all(utf16_len(c) <= 4096 for c in chunks)
    assert "".join(chunks) == text
    assert [utf16_len(c) for c in chunks] == [4095, 1906]  # 4,096 would end inside a pair
    for c in chunks:
        c.encode("utf-8")  # a lone surrogate would raise UnicodeEncodeError


def test_it_prefers_newlines_then_spaces():
    para = "x" * 3000
    chunks = split_message(f"{para}\n{para} {para}")
    assert chunks[0] == para + "\n"


def test_it_never_breaks_a_tag_or_an_entity_and_rebalances_open_tags():
    text = "<b>" + "y" * 4000 + '<a href="https://example.com/a-long-url">link</a> &amp; ' + "z" * 500 + "</b>"
    chunks = split_message(text)
    assert all(utf16_len(c) <= 4096 for c in chunks)
    for c in chunks:
        assert c.count("<b>") == c.count("</b>"), c[-40:]
        assert c.count("<a ") == c.count("</a>")
        assert not re.search(r"<[^>]*$", c) and not re.search(r"&[a-z]*$", c)
    assert chunks[0].startswith("<b>") and chunks[0].endswith("</b>") and chunks[1].startswith("<b>")


def test_a_run_of_units_exactly_at_the_limit_is_one_chunk():
    assert split_message("é" * 4096) == ["é" * 4096]
    assert [utf16_len(c) for c in split_message("😀" * 2049)] == [4096, 2]


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["/venv/bin/daphne", "chatflow_site.asgi:application"], {}, True),
    (["/venv/lib/python3.11/site-packages/daphne/__main__.py", "-p", "8000", "x:app"], {}, True),
    (["/venv/bin/uvicorn", "chatflow_site.asgi:application"], {}, True),
    (["manage.py", "runserver"], {"RUN_MAIN": "true"}, True),
    (["manage.py", "runserver"], {}, False),  # the autoreloader's parent does not serve
    (["manage.py", "runserver", "--noreload"], {}, True),
    (["manage.py", "migrate"], {}, False),
    (["manage.py", "chatflow_worker"], {}, False),
    (["/venv/bin/pytest"], {}, False),
    ([], {}, False),
])
def test_the_embedded_worker_runs_only_in_an_asgi_server(argv, environ, expected):
    assert embedded.serving(argv, environ) is expected


def test_no_embedded_worker_runs_in_tests():
    assert "worker" not in embedded._embedded
