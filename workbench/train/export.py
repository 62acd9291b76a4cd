"""From training to use: one consolidated, unsharded model on disk, and quick inference.

``export`` gathers the full weights whatever the strategy (DDP, FSDP, TP, pipeline
stages) and rank 0 writes ``model.safetensors`` and ``config.json``; ``load_model`` rebuilds
the model in a single process.

On every rank, then anywhere:

>>> export(model, "out/gpt")                         # doctest: +SKIP
>>> gpt = load_model("out/gpt")                      # doctest: +SKIP
>>> generate(gpt, "the river", max_new_tokens=40)    # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workbench.strategies.layout import layout_of
from workbench.train.data import decode, encode
from workbench.train.models import MODELS

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, unsharded, on CPU; collective: call on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    layout = layout_of(model)
    module = layout.base if layout.pp > 1 else model
    sharded = dist.is_initialized() and hasattr(model, "wb_layout")
    if sharded:
        local = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    else:
        local = getattr(module, "module", module).state_dict()
    local = {k: v.detach().cpu().clone() for k, v in local.items()}
    if sharded and layout.pp > 1:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local)
        local = {k: v for part in parts for k, v in part.items()}
    return local


def export(model: nn.Module, path: str | Path, *, arch: dict | None = None) -> Path:
    """Write ``path/model.safetensors`` and ``path/config.json`` (rank 0); every rank calls it."""
    from safetensors.torch import save_file

    path = Path(path)
    arch = arch or layout_of(model).arch
    if not arch:
        raise ValueError("no model config to export: pass arch={'model': 'MLP', 'config': {...}}.")
    state = full_state_dict(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / WEIGHTS))
        (path / CONFIG).write_text(json.dumps(arch, indent=2))
    if dist.is_initialized():
        dist.barrier()
    return path


def load_model(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The exported model, whole, in eval mode."""
    from safetensors.torch import load_file

    path = Path(path)
    arch = json.loads((path / CONFIG).read_text())
    if arch.get("model") not in MODELS:
        raise ValueError(f"unknown model {arch.get('model')!r} in {path / CONFIG}: known are "
                         f"{', '.join(MODELS)}.")
    cls, config_cls = MODELS[arch["model"]]
    model = cls(config_cls(**arch["config"]))
    model.load_state_dict(load_file(str(path / WEIGHTS)))
    return model.to(device).eval()


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output for ``x``, without gradients.

    >>> from workbench.train.models import MLP, MLPConfig
    >>> predict(MLP(MLPConfig(d_in=3, d_out=1)), torch.zeros(2, 3)).shape
    torch.Size([2, 1])
    """
    model.eval()
    return model(x.to(next(model.parameters()).device))


@torch.no_grad()
def generate(model: nn.Module, prompt: str, max_new_tokens: int = 100, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = 0) -> str:
    """Continue ``prompt`` character by character with a TinyGPT.

    >>> from workbench.train.models import TinyGPT, GPTConfig
    >>> len(generate(TinyGPT(GPTConfig(vocab="ab", block_size=4)), "ab", max_new_tokens=5))
    7
    """
    c = model.config
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    ids = encode(prompt, c.vocab).to(device)[None]
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(ids[:, -c.block_size:])[:, -1] / max(temperature, 1e-6)
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
        ids = torch.cat([ids, nxt], dim=1)
    return decode(ids[0], c.vocab)
