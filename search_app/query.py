"""The search syntax: what a person types in the search box, read as terms and filters (never a syntax error).

- words: every word must match (in one message, or in the session's id and metadata);
- ``"a phrase"``: the words in that order (an unclosed quote runs to the end);
- ``tool:check_order_status``: the session called that tool (a call or a result of that name);
- ``agent:Billing``: the session's active agent (as the list's agent filter); ``channel:whatsapp``: its channel;
- the whole query, as typed, also finds the session with exactly that id (an id of emoji or punctuation too).

Anything else is plain text: FTS operators (``AND``, ``NEAR``, ``-``, ``*``, ``^``, ``:``) and quotes are searched
for as words, never interpreted. A word with nothing to index (``*``, an emoji, punctuation) is left out of the
match; a query with nothing left matches nothing. NUL and lone surrogates are removed (PostgreSQL refuses them) and
the query is read up to :data:`MAX_QUERY` characters and :data:`MAX_TERMS` terms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chatflow_agent.jsonsafe import clean_text

__all__ = ["MAX_QUERY", "MAX_TERMS", "SearchQuery", "indexable", "parse"]

MAX_QUERY = 1000
MAX_TERMS = 16
_FILTERS = ("tool", "agent", "channel")
_TOKEN = re.compile(r'"([^"]*)"?|(\S+)')
#: What the FTS tokenizers index: letters and digits (unicode61: categories L*, N*, Co).
_WORD_CHAR = re.compile(r"[^\W_]")


def indexable(term: str) -> bool:
    """True when ``term`` holds something the index has tokens for (a letter or a digit)."""
    return bool(_WORD_CHAR.search(term))


@dataclass(frozen=True)
class SearchQuery:
    """A parsed search: ``terms`` (words and phrases, each matched as a phrase), ``tools``, ``agents`` and
    ``channels`` (each list: any of its values; ``tools``: all of them)."""

    terms: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    #: The whole query as typed (cleaned): a session with exactly this id matches too, whatever characters it has.
    raw: str = ""

    @property
    def text(self) -> tuple[str, ...]:
        """The terms the full-text index can match (those with a letter or a digit)."""
        return tuple(t for t in self.terms if indexable(t))

    @property
    def searches(self) -> bool:
        """True when the query asks the index anything (text or a tool); filters alone do not."""
        return bool(self.text or self.tools)

    @property
    def empty(self) -> bool:
        return not (self.terms or self.tools or self.agents or self.channels)


def parse(q: str) -> SearchQuery:
    """``q`` as a :class:`SearchQuery` (see the module's docstring); never raises."""
    text = clean_text(str(q or "")).replace("\x00", " ")[:MAX_QUERY]
    terms: list[str] = []
    found: dict[str, list[str]] = {name: [] for name in _FILTERS}
    for match in _TOKEN.finditer(text):
        phrase, word = match.group(1), match.group(2)
        if phrase is not None:
            if phrase.strip():
                terms.append(" ".join(phrase.split()))
            continue
        key, sep, value = word.partition(":")
        if sep and key.lower() in _FILTERS and value:
            found[key.lower()].append(value.strip('"'))
        else:
            terms.append(word)
    return SearchQuery(
        terms=tuple(dict.fromkeys(terms))[:MAX_TERMS],
        tools=tuple(dict.fromkeys(t.lower() for t in found["tool"] if t))[:MAX_TERMS],
        agents=tuple(dict.fromkeys(found["agent"]))[:MAX_TERMS],
        channels=tuple(dict.fromkeys(c.lower() for c in found["channel"]))[:MAX_TERMS],
        raw=text.strip(),
    )
