"""URL converters for the console's routes.

``<session:session_id>`` is ``<path:…>`` (any characters, slashes and newlines included, at the end of a
URL) that never resolves a session id containing NUL: PostgreSQL text cannot hold one, so the lookup
would raise ``DataError`` (a 500). Such a URL is a 404 on every database, like any unknown session.
Newlines are allowed because the bot, ``chatflow_chat`` and the webhooks accept such ids: with ``<path:…>``'s
``.+`` their links could not be reversed and the whole session list was a ``NoReverseMatch`` 500.
"""

from __future__ import annotations

from django.urls import register_converter
from django.urls.converters import PathConverter


class SessionIdConverter(PathConverter):
    regex = r"(?s:.+)"

    def to_python(self, value: str) -> str:
        if "\x00" in value:
            raise ValueError("no session id contains NUL")  # Django treats this as "no match" → 404
        return value


register_converter(SessionIdConverter, "session")
