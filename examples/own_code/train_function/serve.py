"""Serving this job's model: the replica loads ``model.pt`` from the checkpoint and calls ``predict``."""

from __future__ import annotations

import torch

MAX_POINTS = 1024


def predict(model: torch.nn.Module, payload: dict) -> dict:
    """``{"points": [[x, y], ...]}`` -> ``{"inside": [true, ...]}``; a ValueError is a 422 with its message."""
    points = payload.get("points") if isinstance(payload, dict) else None
    if not isinstance(points, list) or not 1 <= len(points) <= MAX_POINTS:
        raise ValueError(f'send {{"points": [[x, y], ...]}} with 1 to {MAX_POINTS} points')
    try:
        x = torch.tensor(points, dtype=torch.float32)
    except (TypeError, ValueError):
        raise ValueError("every point is two numbers, [x, y]") from None
    if x.shape != (len(points), 2):
        raise ValueError("every point is two numbers, [x, y]")
    with torch.no_grad():
        inside = model(x).argmax(dim=1) == 1
    return {"inside": inside.tolist()}
