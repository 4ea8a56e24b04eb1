"""Word matching for the demo engine: which tool a user message asks for, and its arguments.

Plain heuristics, deterministic and offline: tool-name words (and, more weakly, description
words) are matched against the user's words after light stemming; arguments are taken from
numbers, ids (tokens with a digit), quoted text, enum values and proper nouns in the message.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from chatflow_agent.core.tools import Tool

__all__ = ["HANDOFF_PREFIX", "Match", "best_match", "fill_arguments", "humanize", "stem", "words"]

HANDOFF_PREFIX = "transfer_to_"
_SPECIALTY_MARK = "Target agent specialty:"

# Words that say nothing about which tool is meant.
_GENERIC = frozenset(
    """a about agent all an and any are as at be by can could data detail details dialogue do does for from
    get give has have hello help hey hi how i id if in info information is it its know let look lookup me
    my need of off on or our please question run should show some tell that the their them there this to
    tool transfer hand handoff target specialty use want was we what when where which who why will with
    would you your execute function call fetch find check""".split()
)
_ID_NAME_HINTS = ("id", "number", "no", "code", "ref", "reference", "sku", "key", "num")
_PREPOSITIONS = frozenset({"in", "for", "at", "to", "about", "from", "named", "called", "of"})


def stem(word: str) -> str:
    """A crude stem so ``orders``/``order`` and ``refunds``/``refunding`` meet."""
    for suffix, repl in (("ies", "y"), ("ing", ""), ("es", ""), ("s", ""), ("ed", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + repl
    return word


def words(text: str) -> list[str]:
    """Lower-case words of ``text``, camelCase and snake_case split."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return re.findall(r"[a-z0-9]+", spaced.lower())


def _content_stems(text: str) -> set[str]:
    return {stem(w) for w in words(text) if w not in _GENERIC and len(w) > 1 and not w.isdigit()}


@functools.lru_cache(maxsize=1024)
def humanize(name: str) -> str:
    """``check_order_status`` → ``check order status``."""
    return " ".join(words(name))


@dataclass
class Match:
    """A tool the user's words point at, with the words that matched."""

    tool: Tool
    score: int
    matched: list[str] = field(default_factory=list)

    @property
    def is_handoff(self) -> bool:
        return self.tool.name.startswith(HANDOFF_PREFIX)


@functools.lru_cache(maxsize=1024)
def _tool_stems(name: str, description: str) -> tuple[bool, frozenset[str], frozenset[str]]:
    """(is a handoff, stems of the tool's name, stems of its description or the peer's specialty): the
    same for every message, so worked out once per tool."""
    is_handoff = name.startswith(HANDOFF_PREFIX)
    name_part = name[len(HANDOFF_PREFIX) :] if is_handoff else name
    text = description.split(_SPECIALTY_MARK, 1)[-1] if is_handoff else description
    return is_handoff, frozenset(_content_stems(name_part)), frozenset(_content_stems(text))


def _score(tool: Tool, user_words: list[str]) -> Match:
    is_handoff, name_stems, desc_stems = _tool_stems(tool.name, tool.description)
    user = {stem(w) for w in user_words}
    name_hits = name_stems & user
    desc_hits = (desc_stems & user) - name_hits
    # A handoff's description is the peer's specialty, so one word of it is enough.
    enough = name_hits or len(desc_hits) >= (1 if is_handoff else 2)
    score = 3 * len(name_hits) + len(desc_hits) if enough else 0
    hits = name_hits | desc_hits
    matched = list(dict.fromkeys(w for w in user_words if stem(w) in hits))
    return Match(tool=tool, score=score, matched=matched)


def best_match(tools: list[Tool], text: str) -> Match | None:
    """The tool whose name (or description) words best fit ``text``; the first wins a tie."""
    user_words = [w for w in words(text) if w not in _GENERIC and len(w) > 1 and not w.isdigit()]
    best: Match | None = None
    for tool in tools:
        match = _score(tool, user_words)
        if match.score and (best is None or match.score > best.score):
            best = match
    return best


def _plain_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf [T, null]`` (Optional) → ``T``."""
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    return {**schema, **options[0]} if len(options) == 1 else schema


class _Candidates:
    """Values found in a message, each used at most once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.quoted = [a or b for a, b in re.findall(r'"([^"]+)"|(?<!\w)\'([^\']+)\'(?!\w)', text)]
        tokens = [t.strip(".,;:!?#-") for t in re.findall(r"[\w\-.@#/]+", text)]
        self.ids = [t for t in tokens if any(c.isdigit() for c in t)]
        self.numbers = [t for t in self.ids if re.fullmatch(r"-?\d+(\.\d+)?", t)]
        tail = re.findall(r"(?<=[a-z,;] )([A-Z][\w\-]+)", text)
        after_prep = re.findall(r"\b(?:" + "|".join(_PREPOSITIONS) + r")\s+([A-Za-z][\w\-]+)", text)
        self.names = [t for t in [*tail, *after_prep] if t.lower() not in _GENERIC]
        self.used: set[str] = set()

    def take(self, pool: list[str]) -> str | None:
        for value in pool:
            if value not in self.used:
                self.used.add(value)
                return value
        return None


def _value_for(name: str, schema: dict[str, Any], found: _Candidates) -> Any:
    schema = _plain_schema(schema)
    kind = schema.get("type")
    if "enum" in schema:
        lowered = found.text.lower()
        return next((v for v in schema["enum"] if str(v).lower() in lowered), None)
    if kind in ("integer", "number"):
        raw = found.take(found.numbers if kind == "number" else [n for n in found.numbers if "." not in n])
        return None if raw is None else (int(raw) if kind == "integer" else float(raw))
    if kind == "boolean":
        return None
    id_like = any(hint in words(name) for hint in _ID_NAME_HINTS)
    pools = [found.ids, found.quoted] if id_like else [found.quoted, found.names, found.ids]
    for pool in pools:
        value = found.take(pool)
        if value is not None:
            return value
    return None


def fill_arguments(tool: Tool, text: str) -> tuple[dict[str, Any], list[str]]:
    """(arguments taken from ``text``, names of required parameters that could not be filled).

    Required parameters are always tried; optional ones only when their name is mentioned.
    """
    schema = tool.json_schema
    required = set(schema.get("required", []))
    mentioned = _content_stems(text) | {stem(w) for w in words(text)}
    found = _Candidates(text)
    args: dict[str, Any] = {}
    missing: list[str] = []
    for name, prop in schema.get("properties", {}).items():
        if name not in required and not ({stem(w) for w in words(name)} & mentioned):
            continue
        value = _value_for(name, prop, found)
        if value is not None:
            args[name] = value
        elif name in required:
            missing.append(name)
    return args, missing
