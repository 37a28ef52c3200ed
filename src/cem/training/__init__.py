"""Training and evaluation: the paper's recipe, exact resumption, torchrun (DDP / FSDP2)."""

from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint, verify_checkpoint
from .config import RunConfig, TrainConfig, apply_overrides, load_run_config
from .evaluate import evaluate
from .rundir import RunDir, run_identity
from .schedule import cosine_schedule, lr_factor
from .trainer import Interrupted, NothingToDo, TrainingError, train

__all__ = [
    "Interrupted",
    "NothingToDo",
    "RunConfig",
    "RunDir",
    "TrainConfig",
    "TrainingError",
    "apply_overrides",
    "cosine_schedule",
    "evaluate",
    "find_checkpoint",
    "load_checkpoint",
    "load_run_config",
    "lr_factor",
    "run_identity",
    "save_checkpoint",
    "train",
    "verify_checkpoint",
]
