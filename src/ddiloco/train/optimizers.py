"""The inner optimizers other than plain AdamW (`inner.make_inner_optimizer` picks one, `InnerConfig`
says which): Muon for the hidden weight matrices with AdamW for the rest (MuLoCo's inner optimizer).

Each is one `torch.optim.Optimizer`: one `param_groups` list the learning-rate schedule sets
(`inner.set_lr`), one `state` keyed by parameter (peer recovery reads and writes it: `learner.peerstate`),
one `state_dict` a learner saves and loads (`learner.state`), one `step` the step hooks see
(`LearnerClient.attach`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

MUON_MOMENTUM = 0.95  # torch.optim.Muon's default, with Nesterov, as Keller Jordan's Muon and MuLoCo use
# Muon's update scaled to AdamW's RMS (0.2 sqrt(max(A, B)), Moonshot's "Muon is Scalable for LLM
# Training"): the AdamW learning rate and weight decay carry over, so one --inner-lr serves both.
MUON_ADJUST_LR = "match_rms_adamw"


def muon_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters Muon takes: the 2-D weight matrices of the hidden layers, that is every 2-D
    parameter but an embedding's (nn.Embedding, nn.EmbeddingBag, or tied to one) and the output head's
    (the weight of the last nn.Linear the model registers). Biases, norms, convolutions (not 2-D),
    embeddings and the head stay with AdamW: the usual Muon recipe (Keller Jordan's, MuLoCo's)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = {id(linears[-1].weight)} if linears else set()
    return [p for p in model.parameters() if p.ndim == 2 and id(p) not in embeddings | head]


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on `matrices`, torch.optim.AdamW on `others`, as one optimizer.

    The two share this optimizer's parameter groups (the same dicts, each with its "kind": "muon" or
    "adamw") and its state, so everything that reads an optimizer sees both: the schedule sets every
    group's lr, a state_dict holds both states, a loaded one reaches both (`load_state_dict` links them
    to the new groups and state). `step` steps Muon, then AdamW."""

    def __init__(
        self,
        matrices: Iterable[torch.nn.Parameter],
        others: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
    ) -> None:
        matrices, others = list(matrices), list(others)
        if not matrices:
            raise ValueError("Muon needs at least one 2-D hidden matrix (`muon_matrices`)")
        self.muon = torch.optim.Muon(
            matrices, lr=lr, weight_decay=weight_decay, momentum=MUON_MOMENTUM, adjust_lr_fn=MUON_ADJUST_LR
        )
        # None where Muon takes every parameter (torch.optim.AdamW refuses an empty list)
        self.adamw = torch.optim.AdamW(others, lr=lr, betas=betas, weight_decay=weight_decay) if others else None
        groups = [dict(g, kind="muon") for g in self.muon.param_groups]
        groups += [dict(g, kind="adamw") for g in self.adamw.param_groups] if self.adamw is not None else []
        super().__init__(groups, {"lr": lr, "weight_decay": weight_decay})
        self._link()

    def _link(self) -> None:
        """Point both optimizers at this one's groups and state (after construction and every load)."""
        self.muon.param_groups = [g for g in self.param_groups if g["kind"] == "muon"]
        self.muon.state = self.state
        if self.adamw is not None:
            self.adamw.param_groups = [g for g in self.param_groups if g["kind"] == "adamw"]
            self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    def kind_of(self, param: torch.Tensor) -> str:
        """ "muon" or "adamw": which optimizer steps `param`."""
        for group in self.param_groups:
            if any(p is param for p in group["params"]):
                return group["kind"]
        raise KeyError("not a parameter of this optimizer")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def fill_state(self) -> None:
        """Every parameter's state as its first step makes it (zeros): the same tensors on every rank of
        a data-parallel job before rank 0's are broadcast (`dataparallel.replicated`)."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if state:
                    continue
                if group["kind"] == "muon":
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                else:
                    fill_adamw_state(state, p)


def fill_adamw_state(state: dict, p: torch.Tensor) -> None:
    """torch.optim.AdamW's state for `p` before its first step (non-fused, non-capturable: a host step)."""
    state["step"] = torch.tensor(0.0)
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
