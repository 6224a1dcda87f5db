"""The base models every contract model derives from: one definition of what "strict" means."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are an error: a typo in a spec must never be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class FromAttributes(BaseModel):
    """A response model that can be read from any object with the same attribute names (a database row
    included, without this package importing the ORM): ``Model.model_validate(row)``."""

    model_config = ConfigDict(from_attributes=True)
