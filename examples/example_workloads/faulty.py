"""The spirals workload with a fault of your choice: try the service's failure handling on purpose.

Submit it as ``"workload": "example_workloads.faulty:build"`` with the spirals config plus:

- ``"fail_after_samples": N``: raise once this worker has loaded N training samples (in this process)
- ``"error": "value" | "oom"``: a ``ValueError`` (a bug in the training code), or a
  ``torch.OutOfMemoryError`` (what CUDA raises when a batch does not fit)
- ``"fail_once_marker": "/path"``: fail only while this file does not exist, and create it when failing,
  so the first failure is followed by a clean run (a transient error)
- ``"stall_s": S``: sleep S seconds while building, before training starts (a job stuck in STARTING)
- ``"slow_rank": R, "slow_s": S``: rank R sleeps S seconds for every training sample it loads (a straggler: a
  slow node, a slow disk)
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from example_workloads import spirals
from workers.workloads.base import Workload

FAULT_KEYS = {"fail_after_samples", "error", "fail_once_marker", "stall_s", "slow_rank", "slow_s"}
ERRORS = {
    "value": lambda: ValueError("faulty workload: a bug in the training code"),
    "oom": lambda: torch.OutOfMemoryError("faulty workload: CUDA out of memory. Tried to allocate 20.00 GiB"),
}


class FailingDataset(Dataset):
    def __init__(self, inner: Dataset, fail_after: int, error: str, marker: str | None):
        self.inner, self.fail_after, self.error, self.marker = inner, fail_after, error, marker
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        self.loaded += 1
        if self.loaded > self.fail_after and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "a").close()
            raise ERRORS[self.error]()
        return self.inner[index]


class SlowDataset(Dataset):
    """Every sample costs ``seconds`` more on ``rank`` (the torch.distributed rank; 0 outside a group)."""

    def __init__(self, inner: Dataset, rank: int, seconds: float):
        self.inner, self.rank, self.seconds = inner, rank, seconds

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        here = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if here == self.rank:
            time.sleep(self.seconds)
        return self.inner[index]


def build(config: dict, seed: int) -> Workload:
    faults = {key: config[key] for key in FAULT_KEYS if key in config}
    workload = spirals.build({k: v for k, v in config.items() if k not in FAULT_KEYS}, seed)
    if faults.get("error", "value") not in ERRORS:
        raise ValueError(f"faulty: error must be one of {sorted(ERRORS)}")
    time.sleep(float(faults.get("stall_s", 0)))
    if "fail_after_samples" in faults:
        workload.train_dataset = FailingDataset(
            workload.train_dataset,
            int(faults["fail_after_samples"]),
            faults.get("error", "value"),
            faults.get("fail_once_marker"),
        )
    if "slow_rank" in faults:
        workload.train_dataset = SlowDataset(
            workload.train_dataset, int(faults["slow_rank"]), float(faults.get("slow_s", 0.01))
        )
    return workload
