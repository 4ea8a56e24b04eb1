"""``{% site_nav as links %}``: the navigation links the current user may open, as ``(label, url, current)``.

A console view records the permission it requires (``console_required`` sets ``console_permission`` on
the view); a link is listed when :func:`sessions_app.access.may` grants it, so the navigation and the
views cannot disagree. The admin is listed for active staff (what the admin site itself checks).
"""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, Resolver404, resolve, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from console_app.listing import waiting_count
from sessions_app.access import VIEW, may

register = template.Library()

#: (label, URL name) in the order shown.
LINKS = (
    ("Sessions", "sessions-list-sessions"),
    ("Agents", "agents-list-agents"),
    ("Live chat", "chat-open-chat"),
    ("Audit log", "sessions-list-actions"),
    ("Replies", "webhooks-list-attention"),
    ("Dashboard", "health-show-dashboard"),
    ("Health", "health-show-health"),
    ("API", "api-v1:openapi-view"),
    ("Help", "docs-list-pages"),
)


def allowed(user, url: str) -> bool:
    """True when ``user`` may open ``url`` (a console view, or the admin for active staff)."""
    try:
        match = resolve(url.split("?", 1)[0])
    except Resolver404:
        return False
    if match.namespace == "admin":
        return bool(user.is_active and user.is_staff)
    perm = getattr(match.func, "console_permission", None)
    return perm is not None and may(user, perm)


@register.simple_tag(takes_context=True)
def site_nav(context: template.Context) -> list[tuple[str, str, bool]]:
    request = context.get("request")
    user = getattr(request, "user", None) or context.get("user")
    if user is None or not user.is_authenticated:
        return []
    here = request.path if request is not None else ""
    links = []
    for label, name in (*LINKS, ("Admin", "admin:index")):
        try:
            url = reverse(name)
        except NoReverseMatch:
            continue
        if allowed(user, url):
            links.append((label, url, here == url or (url != "/" and here.startswith(url) and name != "admin:index")))
    return links


def waiting_badge(count: int, oob: bool = False) -> SafeString:
    """The navigation's badge of sessions waiting for a person (an empty placeholder at 0, so a live
    update can fill it); ``oob``: marked for an htmx out-of-band swap."""
    swap = SafeString(' hx-swap-oob="true"') if oob else ""
    if not count:
        return format_html('<span id="nav-waiting"{}></span>', swap)
    return format_html('<a id="nav-waiting" class="badge mode-waiting" href="{}?mode=waiting&amp;sort=waiting"{}>'
                       '{} waiting</a>', reverse("sessions-list-sessions"), swap, count)


@register.simple_tag(takes_context=True)
def nav_waiting(context: template.Context) -> SafeString:
    """``{% nav_waiting %}``: :func:`waiting_badge` for a user who may see the sessions, else nothing."""
    user = context.get("user")
    if user is None or not may(user, VIEW):
        return SafeString("")
    return waiting_badge(waiting_count())


__all__ = ["LINKS", "allowed", "nav_waiting", "site_nav", "waiting_badge"]
