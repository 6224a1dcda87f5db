"""What a run may call a scalar it reports: one rule for the loop, a workload's own metrics, a training
function's ``ctx.report``, the control plane's event checks, and the specs that name a metric (a sweep's
``metric``, a checkpoint's ``keep_best``, a deployment's best checkpoint)."""

from __future__ import annotations

import re

# Printable ASCII that reads well in a URL, a CSV header and a Prometheus label: no spaces, no control
# characters. Its length is bounded by the control plane's ORCHESTRATOR_MAX_METRIC_NAME_CHARS (default 64).
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:/-]*$"
DEFAULT_MAX_METRIC_NAME_CHARS = 64
DEFAULT_MAX_METRIC_NAMES = 64
# Where a report stands, stored beside a checkpoint's metrics and in a job's latest metrics: never metric names.
POSITION_KEYS = frozenset({"epoch", "step"})

_NAME = re.compile(METRIC_NAME_PATTERN)


def metric_name_problem(name: object, max_chars: int = DEFAULT_MAX_METRIC_NAME_CHARS) -> str | None:
    """Why ``name`` cannot be a metric's name, or None when it can."""
    if not isinstance(name, str):
        return f"a metric name is a string, not {type(name).__name__}"
    if not name:
        return "a metric name cannot be empty"
    if len(name) > max_chars:
        return f"metric name {name[:40]!r}... is {len(name)} characters: at most {max_chars}"
    if not _NAME.match(name):
        return (
            f"metric name {name[:80]!r}: letters, digits and _ . : / - only, starting with a letter or _ "
            "(no spaces or control characters)"
        )
    return None


def check_metric_name(name: object, max_chars: int = DEFAULT_MAX_METRIC_NAME_CHARS) -> str:
    """``name`` itself, or ValueError saying what is wrong with it."""
    problem = metric_name_problem(name, max_chars)
    if problem:
        raise ValueError(problem)
    return name  # type: ignore[return-value]


def compared_metric_problem(name: str, max_chars: int = DEFAULT_MAX_METRIC_NAME_CHARS) -> str | None:
    """Why a metric a spec compares checkpoints or trials by (``checkpoint.keep_best.metric``, a sweep's
    ``metric``) cannot be one, or None: a report's position is no metric, and a name longer than the control
    plane's cap (ORCHESTRATOR_MAX_METRIC_NAME_CHARS) would have every report that carries it refused."""
    if name in POSITION_KEYS:
        return (
            f"{name!r} is a report's position (its epoch and step), not a metric: checkpoints and trials are "
            "compared by a metric they carry, such as val_loss"
        )
    return metric_name_problem(name, max_chars)
