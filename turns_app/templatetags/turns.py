"""Turn record figures in templates: ``{% load turns %}``.

``{{ ms|duration }}`` — milliseconds as ``850 ms`` / ``2.4 s`` / ``3 min 5 s`` (em dash when None).
``{{ cost|usd }}`` — US dollars as ``$0.000123`` (six significant digits at most), ``unknown`` for None.
``{{ n|tokens }}`` — a token count with thousands separators (em dash when None).
``{{ n|tokens_spent:known }}`` — a sum of tokens: ``1,234 tokens``, ``at least 1,234 tokens`` (``known``
false: some turn's counts were unknown) or ``tokens unknown`` (None: none was known).
``{{ cost|cost_spent:known }}`` — a sum of costs: ``$0.0123``, ``at least $0.0123`` (``known`` false) or
``price unknown`` (None, or nothing but unknown and free turns: "at least $0" says nothing).
``{{ calls|price_detail }}`` — how a turn's model calls were priced, one line a call (a title's text).
``{{ calls|override_names }}`` — the model names a turn's calls were priced under by an override.
``{% session_totals session_id as totals %}`` — the session's ``SessionTotals`` (None before any turn).
``{% rollback_usage plan as discarded %}`` — the ``turns_app.usage.Usage`` of the turns a
``sessions_app.actions.RollbackPlan`` removes.
"""

from __future__ import annotations

from decimal import Decimal

from django import template

from turns_app.usage import discarded_usage, totals_of

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


@register.filter
def tokens_spent(total: object, known: object = True) -> str:
    if not isinstance(total, int):
        return "tokens unknown"
    return f"{'' if known else 'at least '}{total:,} tokens"


@register.filter
def cost_spent(cost: object, known: object = True) -> str:
    if cost is None or cost == "" or (not known and Decimal(str(cost)) == 0):
        return "price unknown"
    return f"{'' if known else 'at least '}{usd(cost)}"


def _call_price(call: dict) -> str:
    model = call.get("model") or "model"
    if call.get("cost") is None:
        counts = call.get("input_tokens") is not None and call.get("output_tokens") is not None
        return f"{model}: {'no known price' if counts else 'token counts not reported'}"
    source = "an override" if call.get("price_source") == "override" else call.get("price_source") or "a price"
    named = call.get("priced_as")
    under = f" for {named}" if named and named != model else ""
    return f"{model}: {usd(call['cost'])} from {source}{under}"


@register.filter
def price_detail(calls: object) -> str:
    return "\n".join(_call_price(c) for c in calls if isinstance(c, dict)) if isinstance(calls, list) else ""


@register.filter
def override_names(calls: object) -> str:
    if not isinstance(calls, list):
        return ""
    names = dict.fromkeys(c.get("priced_as") for c in calls
                          if isinstance(c, dict) and c.get("price_source") == "override" and c.get("priced_as"))
    return ", ".join(str(n) for n in names)


@register.simple_tag
def session_totals(session_id: str):
    return totals_of(session_id)


@register.simple_tag
def rollback_usage(plan):
    return discarded_usage(plan.session_id, plan.removed_first_ids)
