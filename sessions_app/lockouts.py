"""Login throttling (django-axes): what the login page says to a locked-out login, and the audit entry of
each lockout.

Failed logins are counted per account and per address (``AXES_*`` in the settings): past the limit, that
account — from any address — and that address — for any account — cannot log in until the cool-off has
passed or an administrator deletes the lockout's "access attempt" in the Django admin. Attempts during a
lockout neither count nor extend it.

The address is the connection's, or — behind the TLS proxy that ``SECURE_PROXY_SSL_HEADER`` says is there —
the one that proxy appended to ``X-Forwarded-For`` (:func:`client_address`): otherwise every login would
come from the proxy's address, and a few wrong passwords from anyone would lock everyone out.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from sessions_app.actions import audit

__all__ = ["LOCKOUT", "audit_lockout", "client_address", "locked_out"]

#: The audit log's action for a lockout (the log's actor is "system": nobody logged in).
LOCKOUT = "login_lockout"


def client_address(request: HttpRequest) -> str:
    """``AXES_CLIENT_IP_CALLABLE``: the address a login came from. Behind the site's proxy, the last
    ``X-Forwarded-For`` entry — the one the proxy itself added; the entries before it are the client's to
    write and are never believed."""
    behind_proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "") if behind_proxy else ""
    last = forwarded.rsplit(",", 1)[-1].strip()
    return last or request.META.get("REMOTE_ADDR", "")


def cool_off_minutes() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)


def locked_out(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the login page again, with why it refuses and until when (429)."""
    ctx = {"form": AuthenticationForm(request), "next": request.POST.get("next", request.GET.get("next", "")),
           "locked_out": True, "cool_off_minutes": cool_off_minutes()}
    return render(request, "registration/login.html", ctx, status=settings.AXES_HTTP_RESPONSE_CODE)


def audit_lockout(sender: Any, request: HttpRequest, username: str | None, ip_address: str | None,
                  **kwargs: Any) -> None:
    """``axes.signals.user_locked_out`` receiver: one audit entry when a lockout begins (axes sends the signal
    again for each attempt refused during it; those carry no new failure count)."""
    if getattr(request, "axes_failures_since_start", None) != settings.AXES_FAILURE_LIMIT:
        return
    with transaction.atomic():
        audit(None, LOCKOUT, "", {}, {"username": username or "", "ip_address": ip_address or "",
                                      "failures": settings.AXES_FAILURE_LIMIT,
                                      "cool_off_minutes": cool_off_minutes()})
