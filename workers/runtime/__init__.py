"""The training runtime: one loop for every workload (data sharding, DDP/FSDP, the optimizer step,
exact-resume checkpoints, RNG state, the event reporter). No Ray here: the loop talks to a small
context object, so it also runs under plain torchrun and in-process in tests."""
