"""Who may use the console: logged-in staff with ``sessions_app.view_chatsession``, plus one permission per action.

Anonymous users are sent to the login page (htmx requests get an ``HX-Redirect`` so the login form
does not land inside a fragment); a logged-in user without the permission gets 403.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect

__all__ = ["VIEW", "FORCE_HANDOFF", "ROLLBACK", "DELETE", "EXPORT", "console_required", "may", "refusal"]

VIEW = "sessions_app.view_chatsession"
FORCE_HANDOFF = "sessions_app.force_handoff"
ROLLBACK = "sessions_app.rollback_session"
DELETE = "sessions_app.delete_session"
EXPORT = "sessions_app.export_transcript"


def may(user: Any, perm: str) -> bool:
    """True when ``user`` is active staff with the console's view permission and ``perm``."""
    return bool(user.is_authenticated and user.is_active and user.is_staff
                and user.has_perm(VIEW) and user.has_perm(perm))


def refusal(user: Any, perm: str) -> str:
    """Why ``user`` may not do what needs ``perm`` (the 403 page's reason)."""
    if not (user.is_active and user.is_staff):
        return "Your account is not a console (staff) account, so it cannot open console pages."
    missing = next((p for p in (VIEW, perm) if not user.has_perm(p)), perm)
    return f"You do not have permission to do this: it needs the {missing.split('.', 1)[-1]!r} permission."


def console_required(perm: str = VIEW) -> Callable:
    """View decorator: login (redirect), staff + view permission + ``perm`` (403)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                if getattr(request, "htmx", False):
                    login = resolve_url(settings.LOGIN_URL)
                    return HttpResponseClientRedirect(f"{login}?{urlencode({'next': request.get_full_path()})}")
                return redirect_to_login(request.get_full_path())
            if not may(request.user, perm):
                raise PermissionDenied(refusal(request.user, perm))
            return view(request, *args, **kwargs)

        wrapper.console_permission = perm  # type: ignore[attr-defined]  # read by the site navigation
        return wrapper

    return decorator
