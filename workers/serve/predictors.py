"""What every predictor is built on (a workload's own predictor lives beside its model, in
``workers/workloads/<name>.py``, and its descriptor names it): ``BadInput`` (a request body the predictor can't
take: a 422 saying what is expected), the body checks, ``RowsPredictor`` (rows of numbers in, classes and
probabilities out) and ``TensorPredictor`` (rows as wide as a custom workload's samples). No Ray: the bench
and the unit tests use them alone."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from orchestrator_contract import workloads

MAX_ROWS = 256  # rows per request


class BadInput(ValueError):
    """A request body the predictor can't take: answered 422 with what is expected."""


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device


def as_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"{where} is {json.dumps(value)[:40]}: expected a number")
    if not math.isfinite(value):
        raise BadInput(f"{where} is not a finite number")
    return float(value)


def only_keys(body: Any, allowed: Sequence[str], required: Sequence[str]) -> dict:
    if not isinstance(body, dict):
        raise BadInput(f"the body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}")
    missing = [key for key in required if key not in body]
    if missing:
        raise BadInput(f"missing key {missing[0]!r}")
    return body


class RowsPredictor:
    """``{"inputs": [[features numbers], ...]}`` -> ``predictions`` (classes) and ``probabilities``.

    A classifier over its output's last dimension, like every workload (see workers.workloads.base).
    Rows from several requests go through one forward pass together.
    """

    features: int
    low: float | None = None  # the range a value must be in; None: any finite number
    high: float | None = None
    unit = "numbers"
    expected: dict[str, str]

    def __init__(self, model: nn.Module, config: dict):
        self.model = model
        self.device = device_of(model)

    def parse(self, body: Any) -> torch.Tensor:
        rows = only_keys(body, ["inputs"], ["inputs"])["inputs"]
        if not isinstance(rows, list):
            raise BadInput("'inputs' must be a list of rows")
        if not rows:
            raise BadInput("'inputs' is empty: send at least one row")
        if len(rows) > MAX_ROWS:
            raise BadInput(f"'inputs' has {len(rows)} rows: at most {MAX_ROWS} per request")
        # Fast path: one conversion and vectorised checks; the element by element walk below only
        # runs to say exactly what is wrong.
        try:
            x = torch.tensor(rows, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            x = None
        if (
            x is not None
            and x.shape == (len(rows), self.features)
            and not any(value.__class__ is bool for row in rows for value in row)
            and bool(torch.isfinite(x).all())
            and (self.low is None or bool((x >= self.low).all()))
            and (self.high is None or bool((x <= self.high).all()))
        ):
            return x
        self._explain(rows)
        raise BadInput(f"'inputs' must be rows of {self.features} numbers")  # not reached in practice

    def _explain(self, rows: list) -> None:
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != self.features:
                got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
                raise BadInput(f"inputs[{i}] has {got}: each row must be {self.features} {self.unit}")
            for j, value in enumerate(row):
                number = as_number(value, f"inputs[{i}][{j}]")
                if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
                    raise BadInput(f"inputs[{i}][{j}] is {number:g}: values are from {self.low:g} to {self.high:g}")

    @torch.no_grad()
    def predict(self, items: list[torch.Tensor]) -> list[dict]:
        """One forward pass over every request's rows together; each request gets its own rows back."""
        probabilities = torch.softmax(self.model(torch.cat(items).to(self.device)).float(), dim=-1).cpu()
        answers, start = [], 0
        for item in items:
            chunk = probabilities[start : start + len(item)]
            start += len(item)
            answers.append({"predictions": chunk.argmax(dim=-1).tolist(), "probabilities": chunk.tolist()})
        return answers

    def probe(self) -> None:
        with torch.no_grad():
            output = self.model(torch.full((1, self.features), self.low or 0.0, device=self.device))
        if not torch.isfinite(output).all():
            raise RuntimeError("the model answers non-finite values")


class TensorPredictor(RowsPredictor):
    """A custom workload whose samples are feature vectors: rows as wide as its training samples."""

    def __init__(self, model: nn.Module, config: dict, workload: str):
        super().__init__(model, config)
        sample = workloads.resolve(workload).load_build()(config, 0).train_dataset[0][0]
        if sample.dim() != 1:
            raise ValueError(
                f"serving answers rows of numbers; {workload}'s samples have shape {tuple(sample.shape)}, not (features,)"
            )
        self.features = int(sample.shape[0])
        self.expected = {"inputs": f"a list of 1 to {MAX_ROWS} rows, each {self.features} finite numbers"}
