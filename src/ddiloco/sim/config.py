"""What one virtual-clock run is: the method, the model and data, the algorithm, the hardware, the faults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..chaos.trace import FailureTrace
from ..core.config import AlgorithmConfig
from ..core.methods import METHODS, algorithm_for
from ..train.inner import InnerConfig
from ..train.streams import SHARD_LAYOUTS, check_shard_layout
from ..wire import quant
from .hardware import LinkModel, StepTimeModel

Method = Literal["ddp", "elastic-ddp", "diloco", "streaming", "decoupled"]  # core.methods.METHODS


@dataclass(frozen=True)
class SimConfig:
    method: Method = "decoupled"
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    shard_layout: str = SHARD_LAYOUTS[0]  # how the text is dealt to the learners (`train.streams`)
    tokenizer: Literal["byte", "bpe"] = "byte"
    bpe_vocab_size: int = 1024
    learners: int = 4
    tokens: int = 200_000
    seed: int = 0
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    steps: StepTimeModel = field(default_factory=StepTimeModel)
    link: LinkModel = field(default_factory=LinkModel)
    failures: FailureTrace = field(default_factory=FailureTrace)
    reconfigure_seconds: float = 5.0  # elastic data-parallel pause on every membership change
    wire_bytes_per_param: float = 2.0  # bf16 outer gradients and fragments
    rejoin_optimizer: Literal["peer", "fresh"] = "peer"
    eval_batches: int = 20
    # None: outer gradients arrive exact (and take wire_bytes_per_param on the link); a codec name
    # (fp32, bf16, int8, int4): they go through that wire codec, values and bytes, as in the runtime.
    codec: str | None = None
    # per-learner batch sizes (mixed hardware runs different batches); missing entries: inner.batch_size
    batch_sizes: tuple[int, ...] = ()

    def batch_size(self, learner: int) -> int:
        return self.batch_sizes[learner] if learner < len(self.batch_sizes) else self.inner.batch_size

    def __post_init__(self) -> None:
        check_shard_layout(self.shard_layout)
        if any(b < 1 for b in self.batch_sizes) or len(self.batch_sizes) > self.learners:
            raise ValueError(f"batch_sizes must be >= 1, one per learner at most, got {self.batch_sizes}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.learners < 1:
            raise ValueError(f"learners must be >= 1, got {self.learners}")
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")
        if self.reconfigure_seconds < 0 or self.wire_bytes_per_param <= 0:
            raise ValueError("reconfigure_seconds must be >= 0 and wire_bytes_per_param > 0")
        if self.codec is not None:
            quant.get(self.codec)  # names the codecs when it is not one of them
        if self.rejoin_optimizer not in ("peer", "fresh"):
            raise ValueError("rejoin_optimizer must be 'peer' or 'fresh'")
        bad = sorted(o.learner for o in self.failures.outages if o.learner >= self.learners)
        if bad:
            raise ValueError(f"failure trace names learner {bad[0]} but there are only {self.learners} learners")

    def effective_algorithm(self) -> AlgorithmConfig:
        """The algorithm the method runs (`core.methods.algorithm_for`): every method is the same core."""
        return algorithm_for(self.method, self.algorithm, self.learners)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["failures"] = [asdict(o) for o in self.failures.outages]
        return d
