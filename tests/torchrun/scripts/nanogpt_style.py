"""A nanoGPT-style training loop: DDP set up from torchrun's environment, gradient accumulation,
init_process_group / destroy_process_group called by the script itself.

torchrun --standalone --nproc-per-node 2 nanogpt_style.py --max_iters=6
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values, overridden by --key=value on the command line (nanoGPT's configurator)
batch_size = 4
block_size = 16
n_embd = 32
n_head = 2
max_iters = 6
gradient_accumulation_steps = 4
learning_rate = 1e-3
backend = "gloo"
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=")
    globals()[key] = type(globals()[key])(val)
# -----------------------------------------------------------------------------

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}" if torch.cuda.is_available() and backend == "nccl" else "cpu"
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process, seed_offset, ddp_world_size, local_world_size, device = True, 0, 1, 1, "cpu"
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,} ({local_world_size} processes on this node)")
torch.manual_seed(1337 + seed_offset)

text = "the quick brown fox jumps over the lazy dog. " * 40
chars = sorted(set(text))
data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
vocab_size = len(chars)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:x.size(1), :x.size(1)], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        logits = self.head(self.blocks(x))
        return logits, F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


torch.manual_seed(1337)  # the same initial weights on every rank
model = GPT().to(device)
torch.manual_seed(1337 + seed_offset)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model

X, Y = get_batch()
for iter_num in range(max_iters):
    lr = learning_rate * 0.5 * (1 + math.cos(math.pi * iter_num / max_iters))
    for group in optimizer.param_groups:
        group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process:
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.6f}, lr {lr:.6f}")

checksum = sum(p.detach().double().sum().item() for p in raw_model.parameters())
print(f"rank {os.environ.get('RANK', 0)} parameter checksum {checksum:.6f}")
if ddp:
    destroy_process_group()
