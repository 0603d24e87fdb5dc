"""Where metrics go besides metrics.jsonl: TensorBoard and Weights & Biases, both optional.

A sink takes the same records as metrics.jsonl (kind, tokens trained, values) and names every value
`<kind>/<name>`, plotted against tokens trained. Each library is imported only when its sink is asked
for, with an install hint when it is missing: neither is a dependency of ddiloco.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Protocol, cast


class Sink(Protocol):
    def write(self, kind: str, tokens: float, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """torch's SummaryWriter: one scalar per value, global step = tokens trained."""

    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError(
                "--tensorboard needs the tensorboard package: pip install tensorboard "
                "(or pip install 'ddiloco[tensorboard]')"
            ) from None
        self._writer = SummaryWriter(log_dir=str(directory))

    def write(self, kind: str, tokens: float, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(f"{kind}/{key}", value, global_step=int(tokens))

    def close(self) -> None:
        self._writer.close()


WANDB_MODES = ("offline", "online")


class WandbSink:
    """A wandb run; offline by default (no network, no account: `wandb sync DIR` uploads it later).

    Tokens are the x-axis (`define_metric`), not wandb's step, so that records of different kinds
    arriving at the same token count are all kept.
    """

    def __init__(
        self,
        directory: Path,
        mode: str = "offline",
        project: str = "ddiloco",
        name: str | None = None,
        config: dict | None = None,
    ) -> None:
        if mode not in WANDB_MODES:
            raise ValueError(f"--wandb-mode must be one of {WANDB_MODES}, got {mode!r}")
        try:
            import wandb
        except ImportError:
            raise ValueError(
                "--wandb needs the wandb package: pip install wandb (or pip install 'ddiloco[wandb]')"
            ) from None
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--wandb directory {directory}: cannot create it ({exc.strerror})") from None
        try:
            self._run = wandb.init(
                mode=cast(Literal["online", "offline"], mode),
                dir=str(directory),
                project=project,
                name=name,
                config=config or {},
                reinit="create_new",
            )
        except Exception as exc:  # noqa: BLE001 - wandb raises its own kinds; the user gets one clear line
            raise ValueError(f"--wandb: wandb could not start a run ({str(exc)[:300]})") from None
        self._run.define_metric("tokens")
        self._run.define_metric("*", step_metric="tokens")
        self.directory = Path(self._run.dir).parent if self._run.dir else directory

    def write(self, kind: str, tokens: float, values: dict[str, float]) -> None:
        self._run.log({"tokens": tokens, **{f"{kind}/{k}": v for k, v in values.items()}})

    def close(self) -> None:
        self._run.finish()
