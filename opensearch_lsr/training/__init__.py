"""Fine-tuning of (transferred) sparse encoders on sentence-transformers' ``SparseEncoderTrainer``."""
from __future__ import annotations

from .config import TrainConfig
from .data import TrainingData, TrainingDataError, load_training_data
from .evaluator import RetrievalDevEvaluator, subset_dataset
from .fused_splade import fused_splade, splade_max_pool
from .loss_log import LossLogCallback, plot_loss_curves, read_loss_log
from .trainer import TrainResult, train

__all__ = [
    "TrainConfig",
    "TrainingData",
    "TrainingDataError",
    "load_training_data",
    "RetrievalDevEvaluator",
    "subset_dataset",
    "fused_splade",
    "splade_max_pool",
    "LossLogCallback",
    "plot_loss_curves",
    "read_loss_log",
    "TrainResult",
    "train",
]
