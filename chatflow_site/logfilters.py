"""Logging filters of the site (``settings.LOGGING``)."""

from __future__ import annotations

import logging

__all__ = ["RefusalInOneLine"]


class RefusalInOneLine(logging.Filter):
    """A refused request (a 4xx) is logged in one line, without a traceback.

    Django's request logger attaches the exception's traceback to the lines of a ``PermissionDenied``
    (403) or a ``BadRequest`` (400): a refusal is the site working as meant, not an error to debug. A
    5xx keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info, record.exc_text = None, None
        return True
