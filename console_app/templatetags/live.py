"""Template filters of the live path: ``{{ row.session_id|session_dom_id }}`` (an HTML id fragment for any id)."""

from django import template

from console_app import listing
from sessions_app import live

register = template.Library()


@register.filter
def session_dom_id(session_id: str) -> str:
    return live.dom_id(str(session_id))


@register.filter
def customer_name(metadata: object) -> str:
    """The customer's display name in session metadata (``display_name``, ``profile_name``…), or ``""``."""
    return listing.customer_name(metadata)


@register.filter
def channel_of(metadata: object) -> str:
    """``metadata.channel`` as text (``""`` when missing)."""
    return str(metadata.get("channel") or "") if isinstance(metadata, dict) else ""
