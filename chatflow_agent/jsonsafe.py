"""JSON-safe values and storable text (invariant 8): what the stores write and the site renders.

Public so that every layer applies the same rule: ``clean_text`` for text, ``json_safe`` for any
value (tool results, metadata), ``json_object`` for a mapping that must stay one.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["clean_text", "json_object", "json_safe"]

from pydantic import BaseModel

_MAX_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Return ``text`` with lone surrogates replaced by U+FFFD and NUL characters removed.

    Lone surrogates cannot be encoded as UTF-8 and NUL cannot be stored in PostgreSQL text.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # One U+FFFD per surrogate code point (a round trip through surrogatepass + "replace"
        # would give one per UTF-8 byte, i.e. three); two halves of a pair written as separate
        # code points are each replaced too.
        text = _SURROGATE.sub("\ufffd", text)
    if "\x00" in text:
        text = text.replace("\x00", "")
    return text


def json_object(value: Any) -> dict[str, Any]:
    """A stored JSON object (``metadata_json`` text, or an already decoded dict) as a dict.

    ``None``, empty text, malformed JSON (written by other software) and non-object JSON all read as ``{}``:
    one unreadable column never makes a session unloadable (invariant 7's spirit).
    """
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value) if value else {}
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def json_safe(value: Any, _depth: int = 0) -> Any:
    """Convert ``value`` into plain JSON types (dict, list, str, int, float, bool, None).

    datetime/date/time → ISO-8601 strings (naive datetimes are taken as UTC); Decimal → str (no
    float rounding); UUID → str; bytes → ``"base64:<data>"``; set/frozenset/tuple → list (sets
    sorted by repr for a stable order); pydantic models → ``model_dump(mode="json")``;
    dataclasses → dict; Enum → its value; anything else → ``str(value)``. Strings are passed
    through :func:`clean_text`. Non-finite floats become strings.
    """
    if _depth > _MAX_DEPTH:
        return "<nested too deeply>"
    d = _depth + 1
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_text(str(k)): json_safe(v, d) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, d) for v in value]
    if isinstance(value, set | frozenset):
        return [json_safe(v, d) for v in sorted(value, key=repr)]
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "base64:" + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, enum.Enum):
        return json_safe(value.value, d)
    if isinstance(value, BaseModel):
        return json_safe(value.model_dump(mode="json"), d)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value), d)
    return clean_text(str(value))
