"""Local data for the tiny models (nothing is downloaded) and a per-rank loader.

>>> x, y = regression_data(8, d_in=4, d_out=2)
>>> tuple(x.shape), tuple(y.shape)
((8, 4), (8, 2))
>>> ds = char_dataset(TEXT[:100], block_size=8)
>>> ds[0][0].shape
torch.Size([8])
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# A small text written for this package, so the GPT has something to learn offline.
TEXT = """\
the river runs down to the sea and the sea runs back to the sky.
the rain falls on the hill and the hill sends it down to the river.
a small boat goes out in the morning and comes home in the evening.
the fisher counts the fish, the baker counts the bread, the child counts the stars.
one star, two stars, three stars over the quiet town.
when the wind is soft the boats go far; when the wind is hard they stay at home.
the old bridge hears every cart and every song that crosses it.
in spring the fields are green, in summer gold, in autumn brown, in winter white.
the teacher writes on the board and the children copy what she writes.
a cat sleeps on the warm stone and dreams of the fish in the river.
the lamp is lit at dusk and put out at dawn, and so the days go round.
""" * 4


def char_vocab(text: str = TEXT) -> str:
    """The sorted alphabet of ``text``."""
    return "".join(sorted(set(text)))


def encode(text: str, vocab: str) -> torch.Tensor:
    index = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - set(index))
    if unknown:
        raise ValueError(f"characters not in the vocabulary: {''.join(unknown)!r}")
    return torch.tensor([index[ch] for ch in text], dtype=torch.long)


def decode(ids, vocab: str) -> str:
    return "".join(vocab[int(i)] for i in ids)


def char_dataset(text: str = TEXT, block_size: int = 32, vocab: str | None = None) -> TensorDataset:
    """Every window of ``block_size`` characters and the same window shifted by one."""
    ids = encode(text, vocab or char_vocab(text))
    n = len(ids) - block_size
    if n < 1:
        raise ValueError(f"the text ({len(ids)} characters) is shorter than block_size + 1 "
                         f"({block_size + 1}).")
    windows = ids.unfold(0, block_size + 1, 1)[:n]
    return TensorDataset(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def regression_data(n: int, d_in: int = 16, d_out: int = 4, seed: int = 0):
    """``(x, y)`` with ``y`` a fixed smooth function of ``x`` plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, d_out, generator=g) / d_in**0.5
    y = torch.tanh(x @ w) + 0.01 * torch.randn(n, d_out, generator=g)
    return x, y


def make_loader(dataset, batch_size: int, *, model=None, shuffle: bool = True, seed: int = 0,
                drop_last: bool = True) -> DataLoader:
    """A ``DataLoader`` over this rank's shard (``DistributedSampler`` on the data-parallel dim).

    Ranks that share a data-parallel index (tensor or pipeline peers) get the same batches.
    The Trainer calls ``sampler.set_epoch`` each epoch, so the shuffle changes every epoch.

    >>> loader = make_loader(char_dataset(TEXT[:200], 8), batch_size=4)   # doctest: +SKIP
    """
    from workbench.strategies.layout import layout_of

    layout = layout_of(model)
    sampler = DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
