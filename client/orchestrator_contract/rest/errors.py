"""The error shapes: every 4xx answers ``{"detail": ...}``, in one of two forms.

- ``ErrorMessage``: one message string (401, 403, 404, 409, 413, 429, 400, and a 422 the handler itself
  refuses, e.g. a cursor it never issued).
- ``FieldErrors``: a list of field errors, the shape of FastAPI's request validation errors; a spec that
  parses but can't run here (a 422 with the field's ``loc``) answers the same, so clients handle one format.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorMessage(BaseModel):
    """An error with one message."""

    detail: str = Field(description="What was wrong, for people (it names the setting or bound, if one).")


class FieldError(BaseModel):
    """One field's error."""

    loc: list[str | int] = Field(description='Where: ["body", field, ...] or ["query", name].')
    msg: str = Field(description="What was wrong.")
    type: str = Field(description="pydantic's error type (e.g. value_error, missing).")


class FieldErrors(BaseModel):
    """A request's field errors (a 422)."""

    detail: list[FieldError] = Field(description="One entry per field error.")
