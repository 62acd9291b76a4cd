"""Tiny models shaped for every strategy: an MLP and a character-level GPT.

Both have the same three parts, so that one set of strategy functions fits both:
``pre`` (input -> hidden), ``blocks`` (a ``ModuleDict`` keyed "0", "1", ... so that a
pipeline stage can drop the blocks it does not own and keep the original parameter
names) and ``post`` (hidden -> output). A stage sets ``pre``/``post`` to ``None``.

>>> import torch
>>> m = MLP(MLPConfig(d_in=4, d_hidden=8, d_out=2, n_layers=2))
>>> m(torch.zeros(3, 4)).shape
torch.Size([3, 2])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class MLPConfig:
    """A residual MLP: ``d_in -> d_hidden -> [n_layers residual blocks] -> d_out``."""

    d_in: int = 16
    d_hidden: int = 32
    d_out: int = 4
    n_layers: int = 4
    expansion: int = 4

    def __post_init__(self):
        for name in ("d_in", "d_hidden", "d_out", "n_layers", "expansion"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLPConfig.{name} must be at least 1 (got {getattr(self, name)}).")


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A tiny decoder-only transformer over characters; ``vocab`` is the alphabet itself."""

    vocab: str
    block_size: int = 32
    n_layers: int = 2
    n_head: int = 2
    d_model: int = 32
    dropout: float = 0.0

    def __post_init__(self):
        if len(self.vocab) < 2 or len(set(self.vocab)) != len(self.vocab):
            raise ValueError("GPTConfig.vocab must hold at least 2 distinct characters, each once.")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head}).")
        if min(self.block_size, self.n_layers, self.n_head) < 1:
            raise ValueError("block_size, n_layers and n_head must be at least 1.")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


class _Staged(nn.Module):
    """``forward = post(blocks(pre(x)))``, skipping the parts a pipeline stage dropped."""

    pre: nn.Module | None
    post: nn.Module | None
    blocks: nn.ModuleDict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre is not None:
            x = self.pre(x)
        for block in self.blocks.values():
            x = block(x)
        if self.post is not None:
            x = self.post(x)
        return x

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def export_config(self) -> dict:
        """What :func:`workbench.train.export.load` needs to rebuild this model."""
        return {"model": type(self).__name__, "config": asdict(self.config)}


# -- MLP --------------------------------------------------------------------------------
class MLPBlock(nn.Module):
    def __init__(self, d: int, expansion: int):
        super().__init__()
        self.fc1 = nn.Linear(d, d * expansion)
        self.fc2 = nn.Linear(d * expansion, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class MLP(_Staged):
    """Regression MLP; loss is mean squared error."""

    def __init__(self, config: MLPConfig | None = None):
        super().__init__()
        self.config = c = config or MLPConfig()
        self.pre = nn.Linear(c.d_in, c.d_hidden)
        self.blocks = nn.ModuleDict({str(i): MLPBlock(c.d_hidden, c.expansion) for i in range(c.n_layers)})
        self.post = nn.Linear(c.d_hidden, c.d_out)

    @staticmethod
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)

    # Tensor-parallel plan, per block: names relative to the block -> "colwise"/"rowwise".
    tp_plan = {"fc1": "colwise", "fc2": "rowwise"}

    def tp_divisors(self) -> dict[str, int]:
        """Sizes a tensor-parallel degree must divide."""
        return {"d_hidden * expansion": self.config.d_hidden * self.config.expansion}


# -- GPT --------------------------------------------------------------------------------
class Embed(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.block_size, c.d_model)

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.head_dim = c.d_model // c.n_head
        self.q = nn.Linear(c.d_model, c.d_model)
        self.k = nn.Linear(c.d_model, c.d_model)
        self.v = nn.Linear(c.d_model, c.d_model)
        self.o = nn.Linear(c.d_model, c.d_model)
        self.dropout = c.dropout

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them.
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class GPTBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.proj = nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(c.d_model)
        self.lm = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, x):
        return self.lm(self.ln(x))


class TinyGPT(_Staged):
    """Character-level GPT: ``(batch, time)`` token ids -> ``(batch, time, vocab)`` logits.

    >>> m = TinyGPT(GPTConfig(vocab="ab", block_size=4))
    >>> m(torch.zeros(1, 4, dtype=torch.long)).shape
    torch.Size([1, 4, 2])
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.pre = Embed(c)
        self.blocks = nn.ModuleDict({str(i): GPTBlock(c) for i in range(c.n_layers)})
        self.post = Head(c)

    @staticmethod
    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    tp_plan = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
               "fc": "colwise", "proj": "rowwise"}

    def tp_divisors(self) -> dict[str, int]:
        """Sizes a tensor-parallel degree must divide."""
        return {"n_head": self.config.n_head}


MODELS = {"MLP": (MLP, MLPConfig), "TinyGPT": (TinyGPT, GPTConfig)}
