"""The files of a committed checkpoint that both sides read.

The training runtime writes them (``workers.runtime.checkpoint_io``); the control plane checks that a folder
holds a model before it deploys it (``orchestrator.services.deployments``), without importing torch.
"""

MODEL_FILE = "model.pt"  # the whole model's state_dict (DDP, or FSDP exported full)
SERVE_MODULE_FILE = "serve.py"  # a training function's code: predict(model, payload), next to model.pt
SHARDED_DIR = "sharded"  # FSDP's sharded model and optimizer (torch.distributed.checkpoint)
