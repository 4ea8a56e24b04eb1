"""``{% site_nav as links %}``: the navigation links the current user may open, as ``(label, url, current)``.

A console view records the permission it requires (``console_required`` sets ``console_permission`` on
the view); a link is listed when :func:`sessions_app.access.may` grants it, so the navigation and the
views cannot disagree. The admin is listed for active staff (what the admin site itself checks).
"""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, Resolver404, resolve, reverse

from sessions_app.access import may

register = template.Library()

#: (label, URL name) in the order shown.
LINKS = (
    ("Sessions", "sessions-list-sessions"),
    ("Agents", "agents-list-agents"),
    ("Live chat", "chat-open-chat"),
    ("Audit log", "sessions-list-actions"),
    ("Replies", "webhooks-list-attention"),
    ("Health", "health-show-health"),
    ("API", "api-v1:openapi-view"),
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


__all__ = ["LINKS", "allowed", "site_nav"]
