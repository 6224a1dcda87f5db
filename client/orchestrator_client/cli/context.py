"""The global options (``--url``, ``--token``, ``--profile``) and the one SDK client a command uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import typer

from orchestrator_client import Client


@dataclass
class Globals:
    url: str | None = None
    token: str | None = None
    profile: str | None = None
    _client: Client | None = field(default=None, repr=False)


def client(ctx: typer.Context) -> Client:
    """The command's client: the global options, else the SDK's own order (ORCHESTRATOR_URL/TOKEN, the
    profile in the config file, http://127.0.0.1:8000). Made once, closed when the command ends."""
    options = globals_of(ctx)
    if options._client is None:
        options._client = Client(url=options.url, token=options.token, profile=options.profile)
        ctx.find_root().call_on_close(options._client.close)
    return options._client


def globals_of(ctx: typer.Context) -> Globals:
    root = ctx.find_root()
    if not isinstance(root.obj, Globals):
        root.obj = Globals()
    return root.obj


def target_url(ctx: typer.Context) -> str | None:
    """The URL the command talks to, when known (for a connection error's message)."""
    options = globals_of(ctx)
    return options._client.url if options._client is not None else options.url
