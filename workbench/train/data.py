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


class ElasticLoader:
    """One epoch's batches split over whichever ranks train now: a change of world size mid-epoch
    skips no sample and repeats none.

    Every rank holds the same permutation of the epoch (``seed + epoch``, as ``DistributedSampler``)
    and the same position in it. A step takes the next ``global_batch`` samples of the permutation and
    gives each rank its share (``global_batch // world_size``, the first ranks one more when it does not
    divide); the position moves on only when the step is committed, so a step abandoned because a rank
    died is taken again, split over the ranks that are left. The order of the epoch is therefore the
    same at every world size: step k always trains on samples ``[k * global_batch, (k + 1) * global_batch)``
    of the permutation.

    >>> loader = ElasticLoader(TensorDataset(torch.arange(12.)), global_batch=4, shuffle=False)
    >>> loader.indices((0, 4), rank=1, world_size=2)
    [6, 7]
    >>> loader.indices((0, 4), rank=0, world_size=3)        # 4 over 3 ranks: 2, 1, 1
    [4, 5]
    >>> loader.advance((0, 8))                              # the epoch is over: the next one begins
    (1, 0)
    """

    def __init__(self, dataset, global_batch: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True, collate_fn=None):
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1 (got {global_batch}).")
        if len(dataset) < global_batch:
            raise ValueError(f"the dataset holds {len(dataset)} samples, fewer than one global batch of "
                             f"{global_batch}: use a smaller batch.")
        self.dataset, self.global_batch = dataset, global_batch
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.collate_fn = collate_fn
        self._perm: tuple[int, list[int]] | None = None  # (epoch, permutation), the current epoch's

    @classmethod
    def from_loader(cls, loader) -> ElasticLoader:
        """The elastic form of a ``DataLoader`` over a ``DistributedSampler`` (what :func:`make_loader`
        returns): the same dataset, shuffle, seed and global batch (batch size x ranks)."""
        sampler = getattr(loader, "sampler", None)
        if not isinstance(sampler, DistributedSampler) or loader.batch_size is None:
            raise ValueError("elastic training needs a DataLoader over a DistributedSampler (wb.make_loader) "
                             "or a wb.ElasticLoader, so that it can split the epoch over the ranks left.")
        return cls(loader.dataset, loader.batch_size * sampler.num_replicas, shuffle=sampler.shuffle,
                   seed=sampler.seed, drop_last=sampler.drop_last, collate_fn=loader.collate_fn)

    def signature(self) -> dict:
        """What every rank's loader must agree on for an epoch to be the same everywhere.

        >>> ElasticLoader(TensorDataset(torch.arange(12.)), global_batch=4).signature()
        {'samples': 12, 'shuffle': True, 'seed': 0, 'drop_last': True}
        """
        return {"samples": len(self.dataset), "shuffle": self.shuffle, "seed": self.seed,
                "drop_last": self.drop_last}

    def permutation(self, epoch: int) -> list[int]:
        """The order of the samples in ``epoch`` (the same on every rank)."""
        if self._perm is None or self._perm[0] != epoch:
            n = len(self.dataset)
            if self.shuffle:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            else:
                order = list(range(n))
            self._perm = (epoch, order)
        return self._perm[1]

    def step_size(self, position: tuple[int, int]) -> int:
        """Samples the step at ``position`` (epoch, offset) takes: a global batch, or the epoch's tail."""
        return min(self.global_batch, len(self.dataset) - position[1])

    def advance(self, position: tuple[int, int], world_size: int = 1) -> tuple[int, int]:
        """The position of the step after the one at ``position``."""
        epoch, offset = position
        return self.start(epoch, offset + self.step_size(position), world_size)

    def start(self, epoch: int, offset: int, world_size: int) -> tuple[int, int]:
        """``(epoch, offset)``, or the next epoch's start where this one has no step left: nothing, less than
        a global batch with ``drop_last``, or fewer samples than ranks (each rank needs one)."""
        left = len(self.dataset) - offset
        if left <= 0 or (self.drop_last and left < self.global_batch) or left < world_size:
            return epoch + 1, 0
        return epoch, offset

    def share(self, size: int, rank: int, world_size: int) -> tuple[int, int]:
        """Where ``rank``'s part of a step of ``size`` samples begins and ends."""
        base, extra = divmod(size, world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (rank < extra)

    def indices(self, position: tuple[int, int], rank: int, world_size: int) -> list[int]:
        """The dataset indices ``rank`` trains on in the step at ``position``."""
        epoch, offset = position
        start, stop = self.share(self.step_size(position), rank, world_size)
        return self.permutation(epoch)[offset + start:offset + stop]

    def batch(self, indices: list[int]):
        """The samples at ``indices``, collated into one batch."""
        if isinstance(self.dataset, TensorDataset):
            at = torch.tensor(indices, dtype=torch.long)
            return tuple(t[at] for t in self.dataset.tensors)
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)([self.dataset[i] for i in indices])
