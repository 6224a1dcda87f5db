"""A training function that owns its loop: the service runs ``main(ctx)`` on every worker.

Points in the square [-2, 2]^2, labelled by whether they lie inside a circle; an MLP learns the boundary.
The data is generated from the job's seed, so nothing is downloaded and every worker sees the same set.
"""

from __future__ import annotations

import itertools
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import TensorDataset

RADIUS_SQUARED = 1.5


def make_points(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(samples, 2, generator=generator) * 4 - 2
    return TensorDataset(x, ((x**2).sum(dim=1) < RADIUS_SQUARED).long())


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    x, y = data.tensors
    model.eval()
    return (model(x.to(device)).argmax(dim=1) == y.to(device)).float().mean().item()


def save(ctx, model: nn.Module, optimizer, metrics: dict, progress: dict) -> None:
    """A committed checkpoint: what resuming needs (``progress``: the epoch to go on with and how far into it),
    and the whole module, which serving loads. Every worker calls it, each with its own folder. ``metrics``
    holds the report's ``epoch`` beside the metrics, as Ray Train's ``train.report`` users write it
    (``ctx.report(metrics, ..., epoch=N)`` says the same)."""
    with tempfile.TemporaryDirectory() as checkpoint:
        if ctx.rank == 0:
            state = {"model": ctx.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(), **progress}
            torch.save(state, os.path.join(checkpoint, "state.pt"))
            torch.save(ctx.unwrap(model), os.path.join(checkpoint, "model.pt"))
        ctx.report(metrics, checkpoint_dir=checkpoint)


def main(ctx) -> None:
    hidden = int(ctx.config.get("hidden", 32))
    train_set = make_points(int(ctx.config.get("samples", 1024)), ctx.seed)
    val_set = make_points(512, ctx.seed + 1)
    model = ctx.prepare(build_model(hidden))  # DDP (or FSDP) as the job says
    optimizer = torch.optim.Adam(model.parameters(), lr=ctx.lr)
    start, done, total = 0, 0, 0.0  # the epoch to go on with, its batches already done, their summed loss
    if (folder := ctx.restore()) is not None:  # a restarted worker group, or a new attempt
        state = torch.load(os.path.join(folder, "state.pt"), weights_only=True)
        ctx.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, done, total = state["epoch"], state.get("batches_done", 0), state.get("loss_sum", 0.0)
    loader = ctx.shard(train_set)  # this worker's share, reshuffled each epoch
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, ctx.epochs):
        model.train()
        batches = done
        for x, y in itertools.islice(loader, done, None):  # after a preemption: the rest of that epoch
            x, y = x.to(ctx.device), y.to(ctx.device)
            optimizer.zero_grad()
            with ctx.autocast():
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
            # Every worker asks at the same step, and all get the same answer at the same step.
            if ctx.should_preempt():  # the control plane wants the workers back: checkpoint here, then return
                progress = {"epoch": epoch, "batches_done": batches, "loss_sum": total}
                # The epochs finished: a resumed ctx.shard replays the interrupted one in the same order.
                save(ctx, model, optimizer, {"train_loss": total / batches, "epoch": epoch}, progress)
                return
        val_accuracy = accuracy(ctx.unwrap(model), val_set, ctx.device)
        metrics = {"train_loss": total / batches, "val_accuracy": val_accuracy, "epoch": epoch + 1}
        save(ctx, model, optimizer, metrics, {"epoch": epoch + 1})
        done, total = 0, 0.0
