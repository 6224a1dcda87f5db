"""What the current request is, for log records: set by the API's request-id middleware, read by logging.

``RequestIdFilter`` puts it on every record as ``request_id`` ("-" outside a request), so a format such as
``%(request_id)s %(message)s`` names the request a line came from.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        return True
