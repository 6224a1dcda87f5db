"""One ``Idempotency-Key`` for every create (``POST /v1/jobs``, ``/v1/sweeps``, ``/v1/deployments``): a request
repeated with the key answers what the first one made (200, ``Idempotent-Replayed: true``); the key with
another request is a 409. The database's unique (project, key) constraint picks the one insert among
concurrent requests, on every replica."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.errors import Conflict

Row = TypeVar("Row")


class IdempotencyConflict(Conflict):
    pass


def create_once(
    session: Session,
    key: str | None,
    find: Callable[[str], Row | None],
    create: Callable[[], Row],
    same_request: Callable[[Row], bool],
    what: str,
) -> tuple[Row, bool]:
    """``(row, created)``: the row ``find(key)`` finds if the key was used (``same_request`` must hold of it,
    else IdempotencyConflict), else ``create()``'s, in a savepoint: a concurrent request with the key that
    won the insert (IntegrityError, or the Conflict a create raises for a taken name) answers with its row."""
    if key and (existing := find(key)) is not None:
        return _replay(existing, same_request, what, key), False
    try:
        with session.begin_nested():
            return create(), True
    except (IntegrityError, Conflict):
        if key and (existing := find(key)) is not None:
            return _replay(existing, same_request, what, key), False
        raise


def _replay(existing: Row, same_request: Callable[[Row], bool], what: str, key: str) -> Row:
    if not same_request(existing):
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} was already used for {what} {existing.id} with a different "  # type: ignore[attr-defined]
            f"{'body' if what == 'deployment' else 'spec'}; use a new key for a new {what}"
        )
    return existing


def request_digest(body: BaseModel) -> str:
    """The SHA-256 of what the client sent (the fields it set, as canonical JSON): a field added later with a
    default does not change it, so a request retried across an upgrade still replays."""
    sent = body.model_dump(mode="json", exclude_unset=True)
    return hashlib.sha256(json.dumps(sent, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def as_stored_today(model: type[BaseModel], stored: dict) -> dict:
    """A stored spec as this version stores it: a field added since it was stored reads as its default, so a
    retried submission of a run stored before an upgrade still replays instead of being a conflict."""
    try:
        return model.model_validate(stored).model_dump(mode="json")
    except ValueError:  # pydantic's ValidationError: a spec this version no longer reads
        return stored
