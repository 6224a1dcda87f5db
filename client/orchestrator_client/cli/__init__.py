"""``orch``: the command line (typer + rich) on the SDK. It makes no HTTP call of its own.

One module per noun (``jobs``, ``sweeps``, ``trials``, ``deployments``, ``projects`` with ``keys``, ``code``,
``plan``, ``usage``, ``session`` for login/whoami/status), ``output`` for tables and ``-o json|yaml``, ``follow`` for
``--follow``, and ``exits`` for every exit code."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.core import TyperGroup

from orchestrator_client.cli import code, deployments, exits, jobs, plan, projects, session, sweeps, trials, usage
from orchestrator_client.cli.context import globals_of, target_url
from orchestrator_client.config import ConfigError
from orchestrator_client.errors import OrchestratorError, ValidationFailed
from orchestrator_client.packing import PackError
from orchestrator_client.specs import SpecError


class _Orch(TyperGroup):
    """The root command: an SDK error anywhere below becomes one line on stderr and its exit code."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except ValidationFailed as error:
            typer.echo(exits.error_line(error), err=True)
            for field_error in error.field_errors:
                loc = ".".join(str(part) for part in field_error.loc if part != "body")
                typer.echo(f"  {loc}: {field_error.msg}", err=True)
            raise typer.Exit(exits.USAGE) from None
        except OrchestratorError as error:
            typer.echo(exits.error_line(error, target_url(ctx)), err=True)
            raise typer.Exit(exits.for_error(error)) from None
        except (SpecError, ConfigError, PackError) as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(exits.USAGE) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(exits.INTERRUPTED) from None


app = typer.Typer(
    cls=_Orch,
    name="orch",
    help="The training orchestrator from a terminal: jobs, sweeps, deployments, projects and keys.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option(help="The service's URL (else ORCHESTRATOR_URL, else the profile's).")
    ] = None,
    token: Annotated[str | None, typer.Option(help="An API key (else ORCHESTRATOR_TOKEN, else the profile's).")] = None,
    profile: Annotated[
        str | None, typer.Option(help="A profile of the config file `orch login` writes (else ORCHESTRATOR_PROFILE).")
    ] = None,
) -> None:
    options = globals_of(ctx)
    options.url, options.token, options.profile = url, token, profile


session.register(app)
plan.register(app)
usage.register(app)
app.add_typer(jobs.app, name="jobs")
app.add_typer(sweeps.app, name="sweeps")
app.add_typer(trials.app, name="trials")
app.add_typer(deployments.app, name="deployments")
app.add_typer(projects.app, name="projects")
app.add_typer(projects.keys_app, name="keys")
app.add_typer(code.app, name="code")


def main() -> None:
    """The ``orch`` console script."""
    app()
