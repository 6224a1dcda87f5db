"""Example custom workloads for the training orchestration service (see ../README.md)."""
