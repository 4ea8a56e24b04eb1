"""The site's own 403 and 404 pages (in its layout, with the reason and a way out), the favicon and log-out.

``forbidden`` and ``not_found`` are ``handler403`` / ``handler404``; ``csrf_failure`` is
``CSRF_FAILURE_VIEW`` (a form whose token is missing or stale, e.g. after logging in again in another tab);
:class:`RequestTooLarge` answers a form body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (or with more than
``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields) with the site's 400 page and one log line, where Django would
answer with its debug page and log a traceback. With DEBUG on Django answers a 404
with its debug page (URL patterns and all); :class:`SiteNotFoundPage` renders the site's page instead,
for an ``Http404`` a view raises and for a URL that matches nothing. An htmx request gets the refusal
alone (the ``refusal`` partial), to be swapped into the page that asked.

While the database does not answer (a connection refused or dropped, a server restarting), a page, the API
and ``/metrics`` answer 503 with the reason and ``Retry-After`` (:class:`DatabaseUnavailable` for what a view
raises and for what a middleware raises, with DEBUG on or off), never a 500 and a traceback per request; the
503 page reads nothing from the database (no user, no messages).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import LogoutView
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.core.signals import got_request_exception
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from sessions_app.unavailable import DATABASE_AWAY, RETRY_AFTER_SECONDS, log_refused, unreachable

__all__ = ["FAVICON", "DatabaseUnavailable", "RequestTooLarge", "SiteLogoutView", "SiteNotFoundPage",
           "csrf_failure", "database_away", "favicon", "forbidden", "not_found", "server_error"]

logger = logging.getLogger("chatflow_site.errors")

FAVICON = Path(settings.BASE_DIR) / "static" / "favicon.svg"


def _page(request: HttpRequest, template: str, status: int, reason: str, error: str = "",
          extra: dict | None = None) -> HttpResponse:
    headers = request.headers  # not request.htmx: RequestTooLarge runs before django-htmx's middleware
    from_htmx = headers.get("HX-Request") == "true" and headers.get("HX-History-Restore-Request") != "true"
    if error and not from_htmx and "text/html" not in request.headers.get("Accept", ""):
        return JsonResponse({"error": error, "detail": reason}, status=status)
    name = f"{template}#refusal" if from_htmx else template
    response = render(request, name, {"reason": reason, "path": request.path, **(extra or {})}, status=status)
    response.site_error_page = True  # type: ignore[attr-defined]
    return response


def _reason(exception: Exception | None, default: str) -> str:
    text = str(exception.args[0]) if exception is not None and exception.args else ""
    # Http404's message from a resolver is a dict (path, tried): never shown.
    return text if text and not text.startswith("{") and isinstance(exception.args[0], str) else default


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page(request, "403.html", 403, _reason(exception, "You do not have permission to do this."))


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    reason = _reason(exception, "There is no page at this address.")
    if reason.startswith("No ") and " matches the given query" in reason:  # get_object_or_404's wording
        reason = "It may have been deleted, or the link is mistyped."
    return _page(request, "404.html", 404, reason)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: 403 with what to do (Django logs the refusal in one line)."""
    return _page(request, "403.html", 403,
                 "This form's security token is missing or out of date (for example after logging in again in "
                 "another tab). Nothing was changed: reload the page and try again.", error="csrf_failed")


class RequestTooLarge:
    """Middleware (before ``CsrfViewMiddleware``, which reads the form): a form body Django refuses to parse
    answers 400 with the site's page (JSON to a client that does not ask for HTML), logged in one line."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.content_type in ("application/x-www-form-urlencoded",
                                                                 "multipart/form-data"):
            try:
                request.POST  # noqa: B018 - parsed here so that a refusal is ours, not a debug page
            except (RequestDataTooBig, TooManyFieldsSent) as exc:
                limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
                logger.warning("Refused %s %s: %s", request.method, request.path, exc)
                return _page(request, "400.html", 400,
                             f"The form sent is too large (the limit is {limit // 1024} KB of text and "
                             f"{settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields). Nothing was changed.",
                             error="request_too_large")
        return self.get_response(request)


class SiteNotFoundPage:
    """Middleware: with DEBUG on, a 404 is the site's page, not Django's debug page (which lists URL patterns)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (settings.DEBUG and response.status_code == 404 and getattr(request, "resolver_match", None) is None
                and not getattr(response, "site_error_page", False)):
            return not_found(request)  # no URL pattern matched
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if settings.DEBUG and isinstance(exception, Http404):
            return not_found(request, exception)
        return None


def database_away(request: HttpRequest) -> HttpResponse:
    """503 with ``sessions_app.unavailable.DATABASE_AWAY``: the site's page (without the user or messages, which
    would need the database), or JSON to a client that does not ask for HTML."""
    request.user = AnonymousUser()  # what the page would otherwise load from the session tables
    response = _page(request, "503.html", 503, DATABASE_AWAY, error="database_unavailable", extra={"messages": ()})
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _note_unreachable(sender: object, request: HttpRequest | None = None, **kwargs: object) -> None:
    """``got_request_exception``, sent while the exception is handled: remember on the request that what
    failed (a view or a middleware) was the database not answering."""
    exception = sys.exc_info()[1]
    if request is not None and unreachable(exception):
        request.database_unreachable = exception  # type: ignore[attr-defined]


class DatabaseUnavailable:
    """Middleware, first in ``MIDDLEWARE``: a request that failed because the database does not answer, in a view
    or in a middleware (reading the session or the user), gets :func:`database_away`, logged in one line, with
    DEBUG on or off (Django turns a middleware's exception into its debug page or ``handler500`` before an outer
    middleware sees it; ``got_request_exception`` tells this one what it was)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        got_request_exception.connect(_note_unreachable, dispatch_uid="chatflow-database-unreachable")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        exception = getattr(request, "database_unreachable", None)
        if exception is None:
            return response
        log_refused(request.method or "", request.path, exception)
        return database_away(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not unreachable(exception):
            return None
        log_refused(request.method or "", request.path, exception)
        return database_away(request)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: Django's plain 500, or :func:`database_away` when what failed (a middleware reading
    the session or the user) was the database not answering."""
    if unreachable(sys.exc_info()[1]):
        return database_away(request)
    from django.views.defaults import server_error as plain

    return plain(request)


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


class SiteLogoutView(LogoutView):
    """Log-out by POST (CSRF-protected); a GET shows a page with the log-out button instead of a 405."""

    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        return render(request, "registration/logout_confirm.html")
