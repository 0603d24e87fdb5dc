"""A small decoder-only transformer language model (GPT-2 style, pre-LayerNorm).

Deliberately free of buffers (no causal-mask buffer, no BatchNorm): a model's whole state
is its `named_parameters()`, which is what the learners exchange and the synchronizer
averages. The embeddings are named `tok_emb.weight` and `pos_emb.weight`
(see `EMBEDDING_NAMES`) because the synchronizer averages them differently.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .mlp import MLP
from .moe import MoEMLP

#: Parameter names of the embedding tables.
EMBEDDING_NAMES = frozenset({"tok_emb.weight", "pos_emb.weight"})


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. `num_experts == 0` means dense MLPs; > 0 means MoE layers."""

    vocab_size: int = 256
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    num_experts: int = 0
    top_k: int = 2
    aux_loss_coef: float = 0.01
    #: Hidden size of each expert as a multiple of d_model (None: same as mlp_ratio).
    expert_mlp_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.num_experts < 0:
            raise ValueError(f"num_experts must be >= 0, got {self.num_experts}")
        if self.num_experts and not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_hidden(self) -> int:
        return int(round(self.d_model * self.mlp_ratio))

    @property
    def expert_hidden(self) -> int:
        ratio = self.mlp_ratio if self.expert_mlp_ratio is None else self.expert_mlp_ratio
        return int(round(self.d_model * ratio))

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through `F.scaled_dot_product_attention(is_causal=True)`."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        shape = (b, t, self.n_heads, c // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)); the MLP is dense or a routed MoE."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp: nn.Module
        if cfg.is_moe:
            self.mlp = MoEMLP(cfg.d_model, cfg.expert_hidden, cfg.num_experts, cfg.top_k, cfg.dropout)
        else:
            self.mlp = MLP(cfg.d_model, cfg.mlp_hidden, cfg.dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.attn(self.ln1(x))
        h = self.mlp(self.ln2(x))
        aux = None
        if isinstance(h, tuple):
            h, aux = h
        return x + h, aux


class GPT(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LayerNorm, untied head.

    `model(idx)` returns logits [B, T, vocab]; `model(idx, return_aux=True)` returns
    (logits, aux) where aux is the MoE load-balancing loss averaged over layers (a zero
    tensor for a dense model). The loss to train on is CE + cfg.aux_loss_coef * aux.
    The aux loss is returned rather than kept on the module so the module stays
    deep-copyable mid-step; `last_aux_loss` keeps a detached copy for logging.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.last_aux_loss: torch.Tensor | None = None
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    nn.init.zeros_(bias)
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=resid_std)

    def forward(self, idx: torch.Tensor, return_aux: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _, t = idx.shape
        if t > self.config.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.config.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        aux_total = x.new_zeros(())
        n_aux = 0
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                aux_total = aux_total + aux
                n_aux += 1
        logits = self.head(self.ln_f(x))
        aux_mean = aux_total / max(n_aux, 1)
        self.last_aux_loss = aux_mean.detach()
        return (logits, aux_mean) if return_aux else logits
