"""Session ids are stored exactly as sent, or refused: one rule for every way an id enters the site.

Every way a person or a channel names a new session applies it: the webhooks (message and session ids),
the live chat page and its socket, and ``chatflow_chat``. Cleaning an id instead (trimming white space,
dropping NUL, replacing unpaired surrogates) would merge distinct ids into one, and an id with controls or
bidi overrides could pass for another in every list and file name that shows it.
"""

from __future__ import annotations

import re

from sessions_app.models import SESSION_ID_MAX_LENGTH

__all__ = ["SESSION_ID_MAX_LENGTH", "id_problem"]

# What an id may not hold: C0/C1 controls (NUL included), unpaired surrogates, line/paragraph separators
# and the bidi embedding/override/isolate controls and marks. Each would be dropped, replaced or shown
# reordered, so two distinct ids could become one, or one could pass for another. U+FFFD is what
# invalid UTF-8 (in an address or a body) was decoded into: the id as sent is unknown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufffd]")


def id_problem(text: str) -> str:
    """Why ``text`` cannot be stored as an id as it is (a phrase to follow the id's name), or ``""``.

    Refused: empty, white space at either end, a control, bidi control, unpaired surrogate or U+FFFD character,
    more than ``SESSION_ID_MAX_LENGTH`` characters.
    """
    if not text.strip():
        return "must be a non-empty string"
    if text != text.strip():
        return "must not start or end with white space"
    if _UNSAFE.search(text):
        return ("holds a control, bidi control, unpaired surrogate or replacement (U+FFFD: invalid UTF-8) character; "
                "it cannot be stored as sent")
    if len(text) > SESSION_ID_MAX_LENGTH:
        return f"is longer than {SESSION_ID_MAX_LENGTH} characters"
    return ""
