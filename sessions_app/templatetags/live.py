"""Template filters of the live path: ``{{ row.session_id|session_dom_id }}`` (an HTML id fragment for any id)."""

from django import template

from sessions_app import live

register = template.Library()


@register.filter
def session_dom_id(session_id: str) -> str:
    return live.dom_id(str(session_id))
