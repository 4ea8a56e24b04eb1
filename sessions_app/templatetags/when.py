"""Dates, one format across the site: ``{% load when %}``.

``{{ value|ago }}`` — a ``<time>`` element reading "5 min ago" (relative to now), with the machine
datetime in ``datetime`` and the absolute time with its time zone in ``title`` (shown on hover).
``{{ value|ago_seconds }}`` — the same, counting seconds under a minute ("32 s ago"), for what moves fast.
``{{ value|stamp }}`` — the absolute time as text: ``2026-01-10 09:00 UTC`` (site time zone).
``{{ value|stamp_time }}`` — the same inside a ``<time datetime=…>`` element; ``stamp_seconds`` with seconds.
Values that are not datetimes render as an em dash.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

FORMAT = "%Y-%m-%d %H:%M"
FORMAT_SECONDS = "%Y-%m-%d %H:%M:%S"


def _local(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_current_timezone())
    return timezone.localtime(value)


def absolute(value: datetime, seconds: bool = False) -> str:
    """``value`` in the site's time zone as ``YYYY-MM-DD HH:MM[:SS] TZ``."""
    local = _local(value)
    return f"{local.strftime(FORMAT_SECONDS if seconds else FORMAT)} {local.tzname()}" if local else "—"


def relative(value: datetime, now: datetime | None = None, seconds_under_a_minute: bool = False) -> str:
    """How long ago ``value`` was: ``just now``, ``5 min ago``, ``3 h ago``, ``2 d ago``; a date after 30 days
    (``in 5 min`` for a time in the future). ``seconds_under_a_minute``: ``32 s ago`` / ``in 8 s`` below 60 s."""
    now = now or timezone.now()
    seconds = (now - value).total_seconds()
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds_under_a_minute and seconds < 60:
        return f"in {int(seconds)} s" if ahead else f"{int(seconds)} s ago"
    if seconds < 45:
        return "just now"
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= size or unit == "min":
            if unit == "d" and seconds >= 30 * 86_400:
                return _local(value).strftime("%Y-%m-%d")
            amount = max(1, round(seconds / size))
            return f"in {amount} {unit}" if ahead else f"{amount} {unit} ago"
    return "just now"  # pragma: no cover - the loop always returns


def _ago(value: object, seconds_under_a_minute: bool) -> str:
    local = _local(value)
    if local is None:
        return "—"
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), absolute(local, True),
                       relative(local, seconds_under_a_minute=seconds_under_a_minute))


@register.filter
def ago(value: object) -> str:
    return _ago(value, False)


@register.filter
def ago_seconds(value: object) -> str:
    return _ago(value, True)


@register.filter
def stamp(value: object) -> str:
    return absolute(value) if _local(value) else "—"


@register.filter
def stamp_time(value: object) -> str:
    local = _local(value)
    if local is None:
        return "—"
    return format_html('<time datetime="{}">{}</time>', local.isoformat(), absolute(local))


@register.filter
def stamp_seconds(value: object) -> str:
    local = _local(value)
    if local is None:
        return "—"
    return format_html('<time datetime="{}">{}</time>', local.isoformat(), absolute(local, True))
