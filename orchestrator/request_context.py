"""What the current request, or a loop's current piece of work, is about, for log records.

``request_id`` is set by the API's request-id middleware; the entity ids (``job_id``, ``sweep_id``,
``trial_id``, ``deployment``) by ``log_context`` where a request (the routes' path parameters, api/app.py)
or a loop (the reconciler, the scheduler, the serving reconciler) works on one entity. Context variables,
so each request's task and each loop's thread sees its own.

``RequestIdFilter`` puts them on every record: ``request_id`` ("-" outside a request, as text formats
expect) and each entity id (None when unknown), so a format such as ``%(request_id)s %(message)s`` names the
request a line came from, and the JSON formatter (``orchestrator.log_format``) adds the ids it finds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
job_id: ContextVar[str | None] = ContextVar("job_id", default=None)
sweep_id: ContextVar[str | None] = ContextVar("sweep_id", default=None)
trial_id: ContextVar[str | None] = ContextVar("trial_id", default=None)
deployment: ContextVar[str | None] = ContextVar("deployment", default=None)

ENTITIES: dict[str, ContextVar[str | None]] = {
    "job_id": job_id,
    "sweep_id": sweep_id,
    "trial_id": trial_id,
    "deployment": deployment,
}


@contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Name the entities the enclosed code works on (``log_context(job_id=...)``); a None leaves one as is."""
    tokens = [(ENTITIES[name], ENTITIES[name].set(value)) for name, value in ids.items() if value is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def bind(**ids: str | None) -> None:
    """Set entity ids for the rest of the current context (a request's task: the middleware resets them)."""
    for name, value in ids.items():
        if value is not None:
            ENTITIES[name].set(value)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        for name, var in ENTITIES.items():
            if not hasattr(record, name):  # an explicit extra={"job_id": ...} wins
                setattr(record, name, var.get())
        return True
