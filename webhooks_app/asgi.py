"""A lean ASGI path for the webhook receiving endpoints: the view without the browser middleware.

Why: under ASGI, Django runs every sync middleware hook (``MiddlewareMixin``) through
``sync_to_async(thread_sensitive=True)`` — about a dozen hand-offs per request to one shared thread,
which queue behind each other and cost 150+ µs each on a small VM (issue 8). The webhook POSTs are
machine to machine and authenticate by signature (HMAC or secret token, checked in the view), so the
session, authentication, messages, CSRF (they are ``csrf_exempt``), clickjacking and htmx middleware
do nothing for them.

Shape: ``LeanWebhookRouter(default)`` is the ``"http"`` entry of the ``ProtocolTypeRouter``. A POST
whose path resolves to a view marked with :func:`lean_webhook` goes to :class:`LeanWebhookHandler`;
everything else (GETs, the console's ledger and retry pages under ``/webhooks/``, unknown paths) goes
to ``default``, Django's normal ASGI application.

What the lean path keeps from the full one: ``ASGIHandler.handle`` (body reading, the
``request_started`` / ``request_finished`` signals that close stale database connections, client
disconnects); the Host check against ALLOWED_HOSTS (400, as CommonMiddleware does); SecurityMiddleware
(HTTPS redirect and security headers), run inline since it does no I/O; Django's mapping of client
errors (``SuspiciousOperation`` → 400, ``Http404``, ``PermissionDenied``) and its 4xx/5xx logging.
Any other exception becomes a JSON 500 ``{"error": "server_error", …}``, logged with its traceback on
``django.request``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core import signals
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, resolve
from django.utils.log import log_response

__all__ = ["LeanWebhookHandler", "LeanWebhookRouter", "lean_webhook"]

# Mapped to 4xx by Django's response_for_exception, as on the full path.
_CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest, SuspiciousOperation, MultiPartParserError)


def lean_webhook(view: Callable) -> Callable:
    """Mark a signature-authenticated async webhook view to be served POSTs without middleware.

    Put it outermost (above ``csrf_exempt`` and ``require_POST``): the mark is read from what
    ``resolve()`` returns. The view must be a coroutine function and must not use ``request.user``,
    ``request.session``, messages or ``request.htmx``.
    """
    view.lean_webhook = True
    return view


def _path_info(scope: dict[str, Any]) -> str:
    """``scope["path"]`` without ``root_path``, as ``ASGIRequest.path_info`` computes it."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and (path == root or path[len(root)] == "/"):
        return path[len(root):]
    return path


def is_lean(scope: dict[str, Any]) -> bool:
    """True for an HTTP POST to a view marked with :func:`lean_webhook`."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    try:
        match = resolve(_path_info(scope))
    except Resolver404:
        return False
    return getattr(match.func, "lean_webhook", False)


class LeanWebhookHandler(ASGIHandler):
    """``ASGIHandler`` whose middleware chain is only the Host check, SecurityMiddleware and the view."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list = []
        self._template_response_middleware: list = []
        self._exception_middleware: list = []
        self._security = SecurityMiddleware(_never_called)
        self._middleware_chain = convert_exception_to_response(self._serve)

    async def _serve(self, request: HttpRequest) -> HttpResponse:
        request.get_host()  # DisallowedHost (a SuspiciousOperation) → 400, as CommonMiddleware does
        response = self._security.process_request(request)  # the HTTPS redirect, when configured
        if response is None:
            response = await self._view(request)
        return self._security.process_response(request, response)

    async def _view(self, request: HttpRequest) -> HttpResponse:
        callback, args, kwargs = self.resolve_request(request)
        try:
            response = await callback(request, *args, **kwargs)
        except _CLIENT_ERRORS:
            raise
        except Exception as exc:
            await signals.got_request_exception.asend(sender=None, request=request)
            response = JsonResponse({"error": "server_error", "detail": "The server failed; deliver again."},
                                    status=500)
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request,
                         exception=exc)  # with its traceback
            return response
        self.check_response(response, callback)
        return response


def _never_called(request: HttpRequest) -> HttpResponse:  # SecurityMiddleware needs a get_response
    raise AssertionError("SecurityMiddleware's hooks are called directly on the lean path")


class LeanWebhookRouter:
    """ASGI app: marked webhook POSTs to :class:`LeanWebhookHandler`, everything else to ``default``."""

    def __init__(self, default: Callable) -> None:
        self.default = default
        self.lean = LeanWebhookHandler()

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        app = self.lean if is_lean(scope) else self.default
        await app(scope, receive, send)
