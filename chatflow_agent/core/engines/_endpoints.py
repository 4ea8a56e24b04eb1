"""Endpoint and credential rules shared by the HTTP engines (chatflow-agent 0.3.4's rules).

An API key taken from the environment is sent only to the official HTTPS endpoint of the
provider that issued it. Any other endpoint needs an explicit ``api_key`` (``""`` meaning "send
no credential"); loopback endpoints (local Ollama, vLLM, LM Studio) may go without one.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

from chatflow_agent.exceptions import ProviderError

__all__ = [
    "is_local_base_url",
    "is_official_endpoint",
    "redact_url",
    "resolve_api_key",
    "unofficial_endpoint_message",
]

_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# 0.3.4 accepts local dev servers bound to 0.0.0.0 as local, although it is not a loopback address.
_COMPAT_LOCAL_BIND_HOSTS = frozenset({"0.0.0.0"})


def is_local_base_url(base_url: str) -> bool:
    """True only for a well-formed http(s) URL whose host is loopback (or ``0.0.0.0``), no userinfo."""
    try:
        parsed = urlsplit(base_url)
        _ = parsed.port  # raises ValueError on a malformed or out-of-range port
    except ValueError:
        return False
    if parsed.scheme.lower() not in ("http", "https") or not parsed.netloc:
        return False
    if parsed.username is not None or parsed.password is not None:
        return False
    hostname = (parsed.hostname or "").lower().rstrip(".")
    return hostname in _LOOPBACK_HOSTS or hostname in _COMPAT_LOCAL_BIND_HOSTS


def is_official_endpoint(base_url: str, official_base_url: str) -> bool:
    """True only when ``base_url`` is exactly the official HTTPS endpoint (scheme, host, port, path).

    Parsed with httpx, the client that sends the request; look-alike hosts, userinfo, plain
    HTTP, a query, a fragment or another path never match.
    """
    try:
        url = httpx.URL(base_url)
        official = httpx.URL(official_base_url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    if url.scheme != "https" or url.userinfo or url.query or url.fragment:
        return False
    return (
        url.host == official.host
        and (url.port or 443) == (official.port or 443)
        and url.path.rstrip("/") == official.path.rstrip("/")
    )


def redact_url(url: str) -> str:
    """Scheme, host, port and path only: error messages never echo userinfo or a query."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return "<invalid URL>"
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii', 'replace')}{parsed.path}"


def unofficial_endpoint_message(base_url: str, env_key: str, official_base_url: str) -> str:
    """The error text for an unofficial endpoint without an explicit key (0.3.4's wording)."""
    return (
        f"A custom or unofficial base_url was provided ({redact_url(base_url)!r}) without an explicit api_key. "
        f"{env_key} is only sent to its official endpoint ({official_base_url}), so it is not used here. "
        "Pass api_key explicitly (or api_key='' if the endpoint needs no authentication)."
    )


def resolve_api_key(api_key: str | None, base_url: str, *, official_base_url: str, env_key: str) -> str:
    """The credential to send to ``base_url`` now; ``""`` means none.

    An explicit ``api_key`` (including ``""``) is used as given; otherwise ``env_key`` is read,
    only for the official endpoint. Raises :class:`ProviderError` when no key may be used.
    """
    if api_key is not None:
        return api_key
    if not is_official_endpoint(base_url, official_base_url):
        raise ProviderError(unofficial_endpoint_message(base_url, env_key, official_base_url))
    key = os.environ.get(env_key)
    if key is None:
        raise ProviderError(
            f"No API key is configured for {redact_url(base_url)}: set the {env_key} environment variable "
            "or pass api_key to the engine (or to the Agent)."
        )
    return key
