"""Who may use the console: logged-in staff with ``sessions_app.view_chatsession``, plus one permission per action.

Anonymous users are sent to the login page (htmx requests get an ``HX-Redirect`` so the login form
does not land inside a fragment), which returns them to the page they were on: for an action (a POST,
whose URL answers nothing to the GET after the login) or an htmx request, the page it was sent from.
A logged-in user without the permission gets 403.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect

__all__ = ["VIEW", "FORCE_HANDOFF", "ROLLBACK", "DELETE", "EXPORT", "CHAT", "codename", "console_required",
           "login_next", "may", "refusal"]

VIEW = "sessions_app.view_chatsession"
FORCE_HANDOFF = "sessions_app.force_handoff"
ROLLBACK = "sessions_app.rollback_session"
DELETE = "sessions_app.delete_session"
EXPORT = "sessions_app.export_transcript"
#: Play turns from the live chat page (agents_app): it writes sessions, so operators, not read-only viewers.
CHAT = "sessions_app.add_chatmessage"


def codename(perm: str) -> str:
    """The codename of ``perm`` (``"app_label.codename"``): what a group is granted by (``sessions_app.groups``)."""
    return perm.split(".", 1)[-1]


def may(user: Any, perm: str) -> bool:
    """True when ``user`` is active staff with the console's view permission and ``perm``."""
    return bool(user.is_authenticated and user.is_active and user.is_staff
                and user.has_perm(VIEW) and user.has_perm(perm))


def refusal(user: Any, perm: str) -> str:
    """Why ``user`` may not do what needs ``perm`` (the 403 page's reason)."""
    if not (user.is_active and user.is_staff):
        return "Your account is not a console (staff) account, so it cannot open console pages."
    missing = next((p for p in (VIEW, perm) if not user.has_perm(p)), perm)
    return f"You do not have permission to do this: it needs the {codename(missing)!r} permission."


def _page_of(request: HttpRequest, url: str) -> str:
    """``url``'s path and query when it is a page of this site other than the request's own URL, else ``""``."""
    if not url or not url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                                      require_https=request.is_secure()):
        return ""
    parts = urlsplit(url)
    page = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return "" if parts.path == request.path else page


def login_next(request: HttpRequest, session_id: str | None = None) -> str:
    """Where the login page returns an anonymous ``request`` to.

    A plain GET: its own URL. An htmx request or an action (a POST: its URL only takes POSTs, so the GET
    after the login would be a 405): the page it was sent from (``HX-Current-URL``, else ``Referer``, when
    it is this site's), else the session's page (``session_id``), else the home page.
    """
    htmx = getattr(request, "htmx", None)
    if request.method in ("GET", "HEAD") and not htmx:
        return request.get_full_path()
    page = _page_of(request, (htmx.current_url if htmx else None) or "") or _page_of(
        request, request.META.get("HTTP_REFERER", ""))
    if page:
        return page
    if request.method in ("GET", "HEAD"):
        return request.get_full_path()
    if session_id is not None:
        return reverse("sessions-show-session", args=[session_id])
    return resolve_url(settings.LOGIN_REDIRECT_URL)


def console_required(perm: str = VIEW) -> Callable:
    """View decorator: login (redirect), staff + view permission + ``perm`` (403)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                after = login_next(request, kwargs.get("session_id"))
                if getattr(request, "htmx", False):
                    login = resolve_url(settings.LOGIN_URL)
                    return HttpResponseClientRedirect(f"{login}?{urlencode({'next': after})}")
                return redirect_to_login(after)
            if not may(request.user, perm):
                raise PermissionDenied(refusal(request.user, perm))
            return view(request, *args, **kwargs)

        wrapper.console_permission = perm  # type: ignore[attr-defined]  # read by the site navigation
        return wrapper

    return decorator
