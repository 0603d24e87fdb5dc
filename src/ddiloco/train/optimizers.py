"""The inner optimizers other than plain AdamW (`inner.make_inner_optimizer` picks one, `InnerConfig`
says which): Muon for the hidden weight matrices with AdamW for the rest (MuLoCo's inner optimizer),
and AdamW with a slow momentum beside its fast one (MT-DAO's).

Each is one `torch.optim.Optimizer`: one `param_groups` list the learning-rate schedule sets
(`inner.set_lr`), one `state` keyed by parameter (peer recovery reads and writes it: `learner.peerstate`),
one `state_dict` a learner saves and loads (`learner.state`), one `step` the step hooks see
(`LearnerClient.attach`).
"""

from __future__ import annotations

import math
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


def fill_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter the state its optimizer's first step makes (zeros): torch.optim.AdamW's, or
    ours (`fill_state` of each). A data-parallel job's ranks receive rank 0's state into these."""
    own = getattr(optimizer, "fill_state", None)
    if callable(own):
        own()
        return
    if not isinstance(optimizer, torch.optim.AdamW):
        raise TypeError(f"no first-step state known for {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not optimizer.state[p]:
                fill_adamw_state(optimizer.state[p], p)


def fill_adamw_state(state: dict, p: torch.Tensor) -> None:
    """torch.optim.AdamW's state for `p` before its first step (non-fused, non-capturable: a host step)."""
    state["step"] = torch.tensor(0.0)
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class SlowFastAdamW(torch.optim.Optimizer):
    """AdamW whose step follows a fast and a slow first moment together (MT-DAO, arXiv 2510.05361).

    MT-DAO's diagnosis: between two syncs of H steps an inner momentum of beta1 = 0.9 (a half-life of
    6.6 steps) forgets the direction the learners shared at the last sync; a slow momentum
    (beta_s ~ 0.99-0.999) keeps it. Its update is a convex combination of the gradient and N momenta
    over Adam's second moment, Delta = [(1 - sum_j w_j) g + sum_j w_j u_j] / (sqrt(v) + eps). Ours is
    the member with N = 2, the fast momentum (beta1) and a slow one (beta_s), and no gradient term:

        m_f <- beta1 m_f + (1 - beta1) g          m_s <- beta_s m_s + (1 - beta_s) g
        v   <- beta2 v   + (1 - beta2) g^2
        theta <- theta (1 - lr lambda)                                   (decoupled weight decay)
        theta <- theta - lr [(1 - w) m_f / (1 - beta1^t) + w m_s / (1 - beta_s^t)]
                            / (sqrt(v / (1 - beta2^t)) + eps)

    w = 0 is AdamW. Our reading: the rule above is the paper's family as its abstract and a summary
    of its method give it (we could not read its method section itself, and its code is not public);
    both momenta are bias-corrected as Adam's m is (the paper builds on ADOPT, we on AdamW); and each
    learner keeps its momenta to itself, never averaged with other learners' (MT-DAO also averages
    them every K_j steps; Decoupled DiLoCo's learners send parameters only).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float],
        slow_beta: float,
        slow_weight: float,
        weight_decay: float,
        eps: float = 1e-8,
    ) -> None:
        if not 0 <= slow_beta < 1 or not 0 <= slow_weight <= 1:
            raise ValueError(f"slow_beta must be in [0, 1), slow_weight in [0, 1]; got {slow_beta}, {slow_weight}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "slow_beta": slow_beta,
            "slow_weight": slow_weight,
            "weight_decay": weight_decay,
            "eps": eps,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            slow_beta, slow_weight = group["slow_beta"], group["slow_weight"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if not state:
                    self._fill(state, p)
                state["step"] += 1
                t = float(state["step"])
                fast, slow, second = state["exp_avg"], state["exp_avg_slow"], state["exp_avg_sq"]
                p.mul_(1 - lr * group["weight_decay"])
                fast.lerp_(grad, 1 - beta1)
                slow.lerp_(grad, 1 - slow_beta)
                second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                direction = fast * ((1 - slow_weight) / (1 - beta1**t)) + slow * (slow_weight / (1 - slow_beta**t))
                denom = (second.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(direction, denom, value=-lr)
        return loss

    @staticmethod
    def _fill(state: dict, p: torch.Tensor) -> None:
        fill_adamw_state(state, p)
        state["exp_avg_slow"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def fill_state(self) -> None:
        """Every parameter's state as its first step makes it (zeros): see `MuonWithAdamW.fill_state`."""
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state[p]:
                    self._fill(self.state[p], p)
