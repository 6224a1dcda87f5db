"""The files of a committed checkpoint that both sides read.

The training runtime writes them (``workers.runtime.checkpoint_io``); the control plane checks that a folder
holds a model before it deploys it (``orchestrator.services.deployments``), without importing torch.
"""

MODEL_FILE = "model.pt"  # the whole model's state_dict (DDP, or FSDP exported full)
SERVE_MODULE_FILE = "serve.py"  # a training function's code: predict(model, payload), next to model.pt
SHARDED_DIR = "sharded"  # FSDP's sharded model and optimizer (torch.distributed.checkpoint)
# Writes MODEL_FILE for a checkpoint saved with only its shards (before FSDP checkpoints carried one).
EXPORT_FULL_COMMAND = "python -m workers.train.export_full"


def shards_only_problem(path: str) -> str:
    """Why a checkpoint with only FSDP shards is not served, and how to make it servable: said alike by the
    control plane (a 422 at deploy) and the replica (a refused load)."""
    return (
        f"checkpoint {path} holds only FSDP shards ({SHARDED_DIR}/), no {MODEL_FILE}: it was saved before every FSDP "
        f"checkpoint carried a full {MODEL_FILE}, and serving loads only {MODEL_FILE} (tensors), never the shards "
        f"(their metadata is a pickle). To serve it, have an operator write {MODEL_FILE} from its shards with "
        f"`{EXPORT_FULL_COMMAND} {path}` (it reads them without unpickling), or deploy a checkpoint of a run "
        "trained since"
    )
