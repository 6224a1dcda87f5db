"""What every SDK object shares: it is the contract's response model (every field typed, the same
definition the server answers with), plus the client that fetched it, kept private so that
``model_dump()`` and ``model_dump_json()`` give exactly the API's JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, PrivateAttr

if TYPE_CHECKING:
    from orchestrator_client.transport import Transport


class Bound(BaseModel):
    _transport: Transport | None = PrivateAttr(default=None)

    @classmethod
    def bind(cls, data: Any, transport: Transport) -> Self:
        obj = cls.model_validate(data)
        obj._transport = transport
        return obj

    @property
    def _http(self) -> Transport:
        if self._transport is None:
            raise RuntimeError(f"this {type(self).__name__} was not fetched by a Client: it cannot call the service")
        return self._transport

    def _refresh(self, data: Any) -> Self:
        """Take a newer answer's fields in place (the same object stays valid for whoever holds it)."""
        fresh = type(self).model_validate(data)
        for name in type(self).model_fields:
            setattr(self, name, getattr(fresh, name))
        return self
