"""The domain's errors: what an operation refuses, by kind, so that every caller (the REST API, the CLI,
a background service) can tell them apart without knowing where they were raised.

The API maps each kind to one HTTP status in one table (``api/errors.py``); nothing in ``orchestrator``
knows about HTTP. Specific errors subclass a kind (``SpecRejected`` is an ``Invalid``, ``AlreadyFinished``
a ``Conflict``, ``RefusedEvent`` a ``Refused``...). The kinds that were ``ValueError`` before stay one.
"""

from __future__ import annotations


class DomainError(Exception):
    """Base of every refusal the caller can act on; ``str(exc)`` is the message the caller sees."""


class Refused(DomainError, ValueError):
    """A request no honest client sends (e.g. an event naming another run's checkpoint): 400."""


class Unauthorized(DomainError):
    """No credential, or one that is unknown, revoked, expired or not this run's: 401."""


class Forbidden(DomainError):
    """The credential's role may not do this: 403."""


class NotFound(DomainError, LookupError):
    """No such object, or not in the caller's project (the same answer: a key learns nothing of others): 404."""


class Conflict(DomainError, ValueError):
    """Conflicts with the object's state, a taken name, or an earlier request: 409."""


class Invalid(DomainError, ValueError):
    """A request that parses but can't be done as given: 422. With ``loc`` (the field's path, as pydantic
    names it) the answer has the shape of a request validation error; without, one message."""

    def __init__(self, message: str, loc: tuple[str | int, ...] | None = None):
        super().__init__(message)
        self.loc = loc


class TooMany(DomainError):
    """Over a per-key limit: 429, with ``retry_after_s`` (the Retry-After header) when one is known."""

    retry_after_s: int | None = None


class TooLarge(DomainError):
    """Over a size cap (an upload, an archive's unpacked size): 413. The message names the setting."""
