"""``{% dedup_ledger session_id %}``: the session's dedup ledger, for the session detail page."""

from django import template
from django.template.loader import render_to_string

from webhooks_app import ledger

register = template.Library()


@register.simple_tag(takes_context=True)
def dedup_ledger(context: template.Context, session_id: str) -> str:
    request = context.get("request")
    ctx = ledger.context(getattr(request, "user", None), session_id)
    return render_to_string("webhooks_app/ledger.html#ledger", ctx, request=request)
