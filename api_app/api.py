"""The REST API under ``/api/v1/``: sessions (the console's filters, search and keyset pages) and transcript exports.

Auth: ``Authorization: Bearer <token>`` (``api_app.models.ApiToken``, acting as its owner) or the console's
login session. The caller must be active staff with ``sessions_app.view_chatsession`` and
``sessions_app.export_transcript`` (the console's :func:`sessions_app.access.may`). No credentials → 401,
no permission → 403; every transcript or bulk export is written to the audit log (action ``export``).

The OpenAPI schema (``openapi.json``) and the docs page (``docs``) need the same credentials: the docs
page sends an anonymous browser to the console's login page, everything else answers 401.

Errors are JSON ``{"detail": …}``: 400 for bad parameters (unknown format, malformed cursor, bad date),
404 for an unknown session (or endpoint: after the credentials are checked), 405 ``{"error":
"method_not_allowed", "detail"}`` with ``Allow`` for a method other than GET. Session ids are arbitrary
strings, captured with ``{anypath:session_id}`` (slashes included; the client percent-encodes the rest).
``/sessions/`` is the list as ``/sessions`` is; ``/sessions/<id>/`` is session ``<id>/`` when it exists,
else session ``<id>``. An id ending in ``/transcript`` is read as that transcript route; its metadata
is also in the list (``q=<id>``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.contrib.auth.views import redirect_to_login
from django.core.handlers.asgi import ASGIRequest
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import register_converter
from django.views.decorators.http import require_GET
from ninja import NinjaAPI, Query, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from ninja.renderers import JSONRenderer
from ninja.security.base import AuthBase
from pydantic import Field

from api_app.models import ApiToken
from chatflow_agent.jsonsafe import clean_text, json_safe
from console_app import export, listing
from sessions_app import actions, unavailable
from sessions_app.access import EXPORT, may
from sessions_app.models import ChatSession, OperatorAction
from takeover_app.access import TAKE_OVER
from turns_app.usage import session_usage, totals_for, totals_of


class AnyPathConverter:
    """Like ``<path:…>`` but also across newlines: a session id may contain any character."""

    regex = r"(?s:.+)"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AnyPathConverter, "anypath")

MAX_PAGE = 200
DEFAULT_PAGE = 50
REDACTIONS = ("contacts",)


# ---- auth -------------------------------------------------------------------------------------
@dataclass
class Caller:
    user: Any
    token: ApiToken | None = None

    @property
    def via(self) -> str:
        return f"token {self.token.name!r} ({self.token.hint}…)" if self.token else "session"


class BearerToken(AuthBase):
    """``Authorization: Bearer <secret>``; a missing or wrong token lets the next method try (then 401)."""

    openapi_type = "http"
    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Caller | None:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        token = ApiToken.authenticate(secret.strip())
        return Caller(token.owner, token) if token else None


class ConsoleSession(AuthBase):
    """The console's login session (GET only, so no CSRF token is involved)."""

    openapi_type = "apiKey"
    openapi_in = "cookie"
    openapi_name = "sessionid"

    def __call__(self, request: HttpRequest) -> Caller | None:
        user = getattr(request, "user", None)
        return Caller(user) if user is not None and user.is_authenticated else None


class Utf8Renderer(JSONRenderer):
    """JSON with real UTF-8 characters; text that cannot be encoded is cleaned, never a 500."""

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        return export.utf8(super().render(request, data, response_status=response_status))

    json_dumps_params = {"ensure_ascii": False}


PERMISSION_DETAIL = "This needs active staff with the view_chatsession and export_transcript permissions."


class ChatflowAPI(NinjaAPI):
    """NinjaAPI whose every URL answers a method it does not serve with the API's JSON 405."""

    @property
    def urls(self) -> tuple[list, str, str]:
        patterns, app_name, namespace = super().urls
        for pattern in patterns:
            pattern.callback = _json_405(pattern.callback)
        return patterns, app_name, namespace


def _json_405(view: Callable) -> Callable:
    """``view`` with its 405 (ninja's is text, Django's empty HTML) made ``{"error", "detail"}`` with ``Allow``."""
    def refusal(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if response.status_code != 405:
            return response
        allowed = response.get("Allow", "GET")
        json_405 = api.create_response(request, {
            "error": "method_not_allowed",
            "detail": f"{request.method} is not allowed on {request.path}; allowed: {allowed}.",
        }, status=405)
        json_405["Allow"] = allowed
        return json_405

    if iscoroutinefunction(view):
        @wraps(view)
        async def checked_async(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return refusal(request, await view(request, *args, **kwargs))
        return checked_async

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return refusal(request, view(request, *args, **kwargs))
    return checked


def _authenticate(request: HttpRequest) -> Caller | None:
    """The caller by the API's auth methods, in order (a token, then the console login); None if none applies."""
    for method in api.auth or []:
        caller = method(request)
        if caller is not None:
            return caller
    return None


def _docs_auth(view: Callable) -> Callable:
    """The schema and docs views behind the data endpoints' auth (token or console login, and the permission)."""
    @wraps(view)
    @require_GET
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        caller = _authenticate(request)
        if caller is None:
            if request.resolver_match and request.resolver_match.url_name == "openapi-view":
                return redirect_to_login(request.get_full_path())
            return _unauthorized(request, AuthenticationError())
        if not may(caller.user, EXPORT):
            return api.create_response(request, {"detail": PERMISSION_DETAIL}, status=403)
        return view(request, *args, **kwargs)
    checked.console_permission = EXPORT  # type: ignore[attr-defined]  # the navigation lists it for this
    return checked


api = ChatflowAPI(
    title="Chatflow Console API",
    version="1",
    description="Sessions and transcript exports. Authenticate with `Authorization: Bearer <token>` "
                "(`manage.py chatflow_token create NAME --user U`) or a console login.",
    urls_namespace="api-v1",
    auth=[BearerToken(), ConsoleSession()],
    renderer=Utf8Renderer(),
    docs=Swagger(settings={"validatorUrl": None}),  # Swagger UI's validator badge would call swagger.io
    docs_url="/docs",
    docs_decorator=_docs_auth,
)


@api.exception_handler(AuthenticationError)
def _unauthorized(request: HttpRequest, exc: Exception) -> HttpResponse:
    response = api.create_response(request, {"detail": "Authentication required: send Authorization: Bearer "
                                              "<token> or log in to the console."}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="chatflow"'
    return response


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_away(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The database does not answer (refused, dropped, restarting): 503 with the reason, not a 500."""
    unavailable.log_refused(request.method, request.path, exc)
    response = api.create_response(request, {"error": "database_unavailable", "detail": unavailable.DATABASE_AWAY},
                                   status=503)
    response["Retry-After"] = str(unavailable.RETRY_AFTER_SECONDS)
    return response


@api.exception_handler(ValidationError)
def _bad_request(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return api.create_response(request, {"detail": "Invalid parameters.", "errors": json_safe(exc.errors)},
                               status=400)


def _caller(request: HttpRequest) -> Caller:
    caller: Caller = request.auth  # type: ignore[attr-defined]
    if not may(caller.user, EXPORT):
        raise HttpError(403, PERMISSION_DETAIL)
    return caller


def _audit(caller: Caller, session_id: str, **details: Any) -> None:
    actions.audit(caller.user, OperatorAction.Kind.EXPORT, session_id, {}, {"via": caller.via, **details})


def _redacted(redact: str) -> bool:
    if redact and redact not in REDACTIONS:
        raise HttpError(400, f"Unknown redaction {redact!r}; valid: {', '.join(REDACTIONS)}.")
    return bool(redact)


#: What the transcript's ``view=operator`` needs besides the export permission (operators, not viewers).
OPERATOR_VIEW = TAKE_OVER


def _operator_view(caller: Caller, view: str, format: str) -> bool:
    """Whether the transcript is the operator view: 400 for an unknown view or a format other than json,
    403 without the take_over permission."""
    if not view:
        return False
    if view != "operator":
        raise HttpError(400, f"Unknown view {view[:40]!r}; valid: operator.")
    if format != "json":
        raise HttpError(400, "view=operator is for format=json.")
    if not may(caller.user, OPERATOR_VIEW):
        raise HttpError(403, "The operator view needs the take_over permission (Operators).")
    return True


def _stream(request: HttpRequest, chunks: Iterator[bytes], content_type: str, disposition: str):
    """A streamed download; under ASGI the chunks are pulled one by one on a worker thread (never buffered)."""
    content: Iterator[bytes] | AsyncIterator[bytes] = _pull(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = disposition
    response["Cache-Control"] = "no-store"
    return response


async def _pull(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    step = sync_to_async(next, thread_sensitive=True)
    while (chunk := await step(chunks, None)) is not None:
        yield chunk


# ---- schemas ------------------------------------------------------------------------------------
class Filters(Schema):
    q: str = Field("", description=(
        "Full-text search (the console's search box): words (all must match, accents and case folded), "
        '`"a phrase"`, `tool:check_order_status`, `agent:Billing`, `channel:whatsapp`; anything else is plain text. '
        "Matches message text, tool calls and results, operator replies, session ids and metadata values (3+ "
        "characters also as a fragment: a phone number's digits). Each item then carries `hits`."))
    agent: str = Field("", description="Active agent name.")
    channel: str = Field("", description="metadata.channel, e.g. whatsapp.")
    mode: str = Field("", description="Takeover mode: " + ", ".join(listing.MODES) + " (who answers the session).")
    updated_from: str = Field("", description="YYYY-MM-DD (site time zone), inclusive.")
    updated_to: str = Field("", description="YYYY-MM-DD (site time zone), inclusive.")
    sort: str = Field("-updated", description="One of " + ", ".join(listing.SORTS) + ".")
    redact: str = Field("", description="`contacts`: mask e-mail addresses and phone numbers.")


class LastMessage(Schema):
    role: str
    text: str


class SessionUsage(Schema):
    turns: int = Field(description="Recorded turns (completed, failed, cancelled, rolled back).")
    input_tokens: int | None = Field(description="Sum of the known counts; null while no turn's is known.")
    output_tokens: int | None
    cached_tokens: int | None
    total_tokens: int | None = Field(description="Sum of the known counts; null while no turn's is known; a "
                                     "lower bound when tokens_known is false.")
    tokens_known: bool = Field(True, description="False once a turn's token counts were not reported.")
    cost: str | None = Field(description="US dollars, a decimal string; null while no turn's cost is known; a "
                             "lower bound when cost_known is false.")
    cost_known: bool = Field(description="False once a turn used a model without a known price, or its token "
                             "counts were not reported.")
    currency: str = "USD"
    last_error: str = Field(description="The last recorded turn's error; empty when it completed.")


class HitOut(Schema):
    message_id: int
    turn: int = Field(description="The message's turn (1 = the first; 0 = before the first turn), as the session "
                                  "page and the transcript number them.")
    role: str
    agent: str = Field(description="The agent that answered that turn (else the session's active agent).")
    created_at: datetime | None
    snippet_html: str | None = Field(description="Up to ~180 characters around the match, HTML-escaped, each match "
                                                 "in <mark>…</mark>; null with redact=contacts.")


class SearchOut(Schema):
    hits: list[HitOut] = Field(description="The newest matching messages (at most 3).")
    total: int = Field(description="How many of the session's messages match.")
    session_match: bool = Field(description="The session's id or a metadata value matches.")


class SessionOut(Schema):
    session_id: str
    active_agent: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    message_count: int
    turn_count: int
    running: bool = Field(description="A turn holds the session's lease right now.")
    last_message: LastMessage | None = None
    usage: SessionUsage | None = Field(None, description="The session's recorded turns' totals; null before its "
                                       "first recorded turn.")
    mode: str = Field("bot", description="Who answers: bot (the agents), waiting (a person was asked for; the bot "
                                         "does not answer) or human (an operator took it over).")
    owner: str | None = Field(None, description="The operator's username in mode human, else null.")
    waiting_since: datetime | None = Field(None, description="When it started waiting for a person (modes waiting "
                                                             "and human), else null.")
    unread: int = Field(0, description="Customer messages stored since the operator last replied.")
    search: SearchOut | None = Field(None, description="With `q`: what matched in this session; else null.")


class SessionPage(Schema):
    items: list[SessionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class ErrorOut(Schema):
    detail: str


def _query(filters: Filters, cursor: str = "") -> listing.ListQuery:
    query = listing.parse_query({**filters.dict(), "after": cursor})
    # The console's rules (listing.parse_query): a refused value is a 400 here, never a filter left out.
    if "sort" in query.errors:
        raise HttpError(400, f"Unknown sort {filters.sort[:40]!r}; valid: {', '.join(listing.SORTS)}.")
    if "after" in query.errors:  # the cursor, which the console calls after
        raise HttpError(400, "Malformed cursor: pass the next_cursor of a previous page unchanged.")
    if query.errors:
        raise HttpError(400, " ".join(query.errors.values()))
    return query


def _session_out(s: ChatSession, redacted: bool, running: bool = False, last: tuple | None = None,
                 totals: Any = None) -> dict:
    out = {
        "session_id": s.session_id, "active_agent": s.active_agent_name,
        "metadata": json_safe(s.metadata if isinstance(s.metadata, dict) else {}),
        "created_at": s.created_at, "updated_at": s.updated_at,
        "message_count": s.message_count, "turn_count": s.turn_count, "running": running,
        "last_message": {"role": last[0], "text": clean_text(last[1])} if last and last[1] else None,
        "usage": session_usage(totals),
        "mode": getattr(s, "mode", None) or "bot",
        "owner": (getattr(s, "mode_owner", None) or None) if getattr(s, "mode", "") == "human" else None,
        "waiting_since": getattr(s, "waiting_since", None),
        "unread": getattr(s, "unread", 0) or 0,
        "search": _search_out(getattr(s, "search", None), redacted),
    }
    if redacted:
        out["metadata"] = export.redact(out["metadata"])
        if out["last_message"]:
            out["last_message"]["text"] = export.redact(out["last_message"]["text"])
    return out


def _search_out(found: Any, redacted: bool) -> dict | None:
    if found is None:
        return None
    hits = [{"message_id": h.message_id, "turn": h.turn, "role": h.role, "agent": h.agent, "created_at": h.at,
             "snippet_html": None if redacted else str(h.snippet)} for h in found.hits]
    return {"hits": hits, "total": found.total, "session_match": found.session_match}


def _get_session(session_id: str, slash_optional: bool = False) -> ChatSession:
    """The session, or a 404; with ``slash_optional``, ``<id>/`` that does not exist is read as ``<id>``."""
    if "\x00" in session_id or clean_text(session_id) != session_id:
        raise HttpError(404, "No such session.")
    session = listing.one(session_id)
    if session is None and slash_optional and session_id.endswith("/"):
        session = listing.one(session_id[:-1])
    if session is None:
        raise HttpError(404, f"No session {session_id!r}.")
    return session


# ---- endpoints ----------------------------------------------------------------------------------
@api.get("/sessions", response={200: SessionPage, 400: ErrorOut}, url_name="api-list-sessions",
         summary="List sessions (newest first by default), one keyset page")
@api.get("/sessions/", response={200: SessionPage, 400: ErrorOut}, url_name="api-list-sessions-slash",
         include_in_schema=False)
def list_sessions(request: HttpRequest, filters: Query[Filters], cursor: str = "",
                  limit: int = Query(DEFAULT_PAGE, description=f"Page size, 1–{MAX_PAGE} (larger is capped).")):
    _caller(request)
    redacted = _redacted(filters.redact)
    query = _query(filters, cursor)
    rows, next_cursor = listing.fetch_page(query, per_page=min(max(1, limit), MAX_PAGE))
    totals = totals_for([s.session_id for s in rows])
    listing.attach_hits(query, rows)
    items = [_session_out(s, redacted, bool(s.running), (s.last_role, s.last_text), totals.get(s.session_id))
             for s in rows]
    return {"items": items, "next_cursor": next_cursor}


@api.get("/sessions/{anypath:session_id}/transcript", url_name="api-export-transcript",
         response={200: dict[str, Any], 400: ErrorOut, 404: ErrorOut},
         summary="One session's transcript as json (turn-grouped), jsonl, md or csv",
         openapi_extra={"responses": {200: {"description": "The transcript as a download", "content": {
             "application/json": {}, "application/x-ndjson": {}, "text/markdown": {}, "text/csv": {}}}}})
def session_transcript(request: HttpRequest, session_id: str, format: str = "json", redact: str = "",
                       view: str = Query("", description="`operator`: the JSON transcript adds `operator_view` "
                                         "(takeover mode and owner, the private hand-back note for the agent, "
                                         "operator replies' deliveries). Needs the take_over permission; "
                                         "format json only.")):
    caller = _caller(request)
    if format not in export.FORMATS:
        raise HttpError(400, f"Unknown format {format!r}; valid formats: {', '.join(export.FORMATS)}.")
    operator = _operator_view(caller, view, format)
    redacted = _redacted(redact)
    session = _get_session(session_id)
    content_type, ext = export.FORMATS[format]
    _audit(caller, session.session_id, format=format, redact=redact, **({"view": view} if view else {}))
    disposition = export.content_disposition(session.session_id, ext, redacted=redacted)
    if format == "json":
        record = export.transcript(session, redacted=redacted)
        if operator:
            extra = export.operator_view(session.session_id)
            record["operator_view"] = export.redact(extra) if redacted else extra
        body = export.utf8(export.dumps(record, indent=2) + "\n")
        response = HttpResponse(body, content_type=content_type)
        response["Content-Disposition"] = disposition
        response["Cache-Control"] = "no-store"
        return response
    writer = {"jsonl": export.transcript_jsonl, "md": export.transcript_md, "csv": export.transcript_csv}[format]
    return _stream(request, writer(session, redacted=redacted), content_type, disposition)


@api.get("/sessions/{anypath:session_id}", response={200: SessionOut, 404: ErrorOut}, url_name="api-show-session",
         summary="One session: metadata, active agent, counts, timestamps")
def show_session(request: HttpRequest, session_id: str, redact: str = ""):
    _caller(request)
    redacted = _redacted(redact)
    s = _get_session(session_id, slash_optional=True)
    return _session_out(s, redacted, bool(s.running), (s.last_role, s.last_text), totals_of(s.session_id))


@api.get("/export.jsonl", url_name="api-export-sessions", response={200: dict[str, Any], 400: ErrorOut},
         summary="Every session matching the filters, one JSON transcript per line (streamed)",
         openapi_extra={"responses": {200: {"description": "JSONL download",
                                              "content": {"application/x-ndjson": {}}}}})
def export_sessions(request: HttpRequest, filters: Query[Filters]):
    caller = _caller(request)
    redacted = _redacted(filters.redact)
    query = _query(filters)
    _audit(caller, "*", format="jsonl", bulk=True, redact=filters.redact,
           filters={k: v for k, v in query.params().items() if k != "after"})
    return _stream(request, export.bulk_jsonl(query, redacted=redacted), export.FORMATS["jsonl"][0],
                   export.content_disposition("all", "jsonl", stem="sessions"))


@api.get("/{anypath:rest}", include_in_schema=False)
def not_found(request: HttpRequest, rest: str):
    """Anything else under /api/v1/ is a JSON 404 too (not the site's HTML page), after the credentials (401)."""
    raise HttpError(404, "No such endpoint.")
