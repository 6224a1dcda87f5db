"""One attempt of a training job on Ray Train: the Ray job's driver, the TorchTrainer it builds, the
callbacks in Train's controller, failure classification and restart budgets, and committed checkpoints."""
