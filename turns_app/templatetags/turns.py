"""Turn record figures in templates: ``{% load turns %}``.

``{{ ms|duration }}`` — milliseconds as ``850 ms`` / ``2.4 s`` / ``3 min 5 s`` (em dash when None).
``{{ cost|usd }}`` — US dollars as ``$0.000123`` (six significant digits at most), ``unknown`` for None.
``{{ n|tokens }}`` — a token count with thousands separators.
``{% session_totals session_id as totals %}`` — the session's ``SessionTotals`` (None before any turn).
``{% rollback_usage plan as discarded %}`` — the ``turns_app.console.Usage`` of the turns a
``sessions_app.actions.RollbackPlan`` removes.
"""

from __future__ import annotations

from decimal import Decimal

from django import template

from turns_app.console import discarded_usage, totals_of

register = template.Library()


@register.filter
def duration(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "—"
    if value < 1000:
        return f"{value:.0f} ms"
    if value < 60_000:
        return f"{value / 1000:.1f} s"
    minutes, seconds = divmod(round(value / 1000), 60)
    return f"{minutes} min {seconds} s"


@register.filter
def usd(value: object) -> str:
    if value is None or value == "":
        return "unknown"
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        return "unknown"
    if amount == 0:
        return "$0"
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    text = f"{amount.normalize():.6g}"
    if "e" in text:
        text = f"{amount:.10f}".rstrip("0")
    return "$" + text


@register.filter
def tokens(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "—"


@register.simple_tag
def session_totals(session_id: str):
    return totals_of(session_id)


@register.simple_tag
def rollback_usage(plan):
    ids = [i for n in plan.removed_turns if (i := plan.first_message_id(n)) is not None]
    return discarded_usage(plan.session_id, ids)
