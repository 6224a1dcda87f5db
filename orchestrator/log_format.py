"""How the control plane's log lines look (ORCHESTRATOR_LOG_FORMAT): text for people, or one JSON object a
line for a log pipeline, with the request and the entities it was about (``orchestrator.request_context``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from orchestrator.request_context import ENTITIES, RequestIdFilter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", "request_id"?, "job_id"?, ..., "exception"?}``: the ids only
    where known, so a line says nothing it does not know."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid and rid != "-":
            line["request_id"] = rid
        for name in ENTITIES:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def log_handler(log_format: str, stream=None) -> logging.Handler:
    """A handler for ``log_format`` ("text" or "json") that knows the request and the entities."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RequestIdFilter())  # on the handler: it then sees records of every logger, uvicorn's too
    return handler


# For json: uvicorn's loggers lose any handler of their own (an earlier uvicorn in the process may have set
# its defaults, with propagate off) and pass their records up to the root handler, one format for all.
_UVICORN_TO_ROOT = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {
        name: {"handlers": [], "propagate": True, "level": "INFO"}
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
    },
}


def uvicorn_log_config(log_format: str) -> dict:
    """What ``uvicorn.run(log_config=...)`` gets: its own handlers for text; for json, none, so its loggers (the
    access log included, which then carries the request id) go through the root handler."""
    import uvicorn.config

    return _UVICORN_TO_ROOT if log_format == "json" else uvicorn.config.LOGGING_CONFIG


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    """The root logger's one handler, in ``log_format``."""
    logging.basicConfig(level=level, handlers=[log_handler(log_format)], force=True)
