"""What a request gets while the database does not answer (refused, dropped, restarting): one reason, one
``Retry-After``, one log line, for the site's pages (``chatflow_site.errors``) and the API (``api_app.api``)
alike. The 503 responses themselves are built by those two, each in its own form."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError

__all__ = ["DATABASE_AWAY", "RETRY_AFTER_SECONDS", "log_refused", "unreachable"]

logger = logging.getLogger(__name__)

#: The reason a 503 gives while the database does not answer.
DATABASE_AWAY = "The database is not answering right now, so nothing was read or changed. Try again in a moment."
#: The seconds its ``Retry-After`` suggests.
RETRY_AFTER_SECONDS = 10


def unreachable(exception: BaseException | None) -> bool:
    """True for the errors of a database that does not answer (refused, dropped, restarting)."""
    return isinstance(exception, (OperationalError, InterfaceError))


def log_refused(method: str, path: str, exception: BaseException) -> None:
    """One warning line per refused request (the error's first line, not a traceback)."""
    first = str(exception).strip().split("\n")[0]
    logger.warning("%s %s: 503, the database does not answer (%s: %s)", method, path, type(exception).__name__, first)
