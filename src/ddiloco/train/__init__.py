"""Models, data and the `Task` abstraction that the training drivers use.

Start from `make_task("gpt" | "gpt-moe" | "vision", data)`; see `tasks.Task` for the interface.
"""

from .streams import Batch, BatchStream
from .tasks import (
    MODEL_SIZES,
    MODELS,
    LanguageModelTask,
    Task,
    VisionTask,
    count_parameters,
    make_task,
)

__all__ = [
    "Batch",
    "BatchStream",
    "Task",
    "LanguageModelTask",
    "VisionTask",
    "make_task",
    "count_parameters",
    "MODELS",
    "MODEL_SIZES",
]
