"""The training data, by ``model.kind``, as fixed train/validation/test splits of (input, target) rows:

- ``SyntheticRegressionData`` (``mlp``): a fixed random teacher network plus noise, generated from the
  data's own seed;
- ``TextData`` (``transformer``): windows of bytes of Python's standard library (``text.py``), at
  offsets drawn from the data's own seed, each target the window shifted by one byte.

Both are ``SplitData``: training batches in an order that a step number alone fixes (``ResumableBatches``),
evaluation splits sharded across processes without padding."""

from __future__ import annotations

import hashlib

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from .config import ConfigError
from .text import split_bytes, windows


def make_splits(
    input_dim: int, output_dim: int, sizes: tuple[int, int, int], noise: float, seed: int
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train, validation and test splits of ``y = teacher(x) + noise * e``, the same bits for the same arguments.

    Everything is drawn on the CPU from one private generator, so the data depend on nothing else:
    neither the training seed, nor the device, nor the order in which other code drew random numbers.
    """
    g = torch.Generator().manual_seed(seed)
    hidden = 64
    w1 = torch.randn(input_dim, hidden, generator=g) / input_dim**0.5
    w2 = torch.randn(hidden, output_dim, generator=g) / hidden**0.5
    splits = []
    for size in sizes:
        x = torch.randn(size, input_dim, generator=g)
        y = torch.tanh(x @ w1) @ w2 + noise * torch.randn(size, output_dim, generator=g)
        splits.append(TensorDataset(x, y))
    return tuple(splits)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of the training split for one epoch: a function of (seed, epoch) alone."""
    digest = hashlib.sha256(f"rmsnorm_kernel/{seed}/{epoch}".encode()).digest()
    return torch.randperm(n, generator=torch.Generator().manual_seed(int.from_bytes(digest[:8], "little")))


class ResumableBatches:
    """Training batches, epoch after epoch, that can start again at any step.

    Training step s (one batch per step) takes global batch s % B of epoch s // B, where B is the number
    of full global batches in the split, in the order ``epoch_order`` gives. Resuming at step s needs
    only s, which a checkpoint holds as its global step, so a run resumed mid-epoch sees exactly the
    batches the uninterrupted run would have seen. (A plain shuffled DataLoader starts its epoch over.)

    Under data parallelism each of ``world_size`` processes takes its own slice of the same global batch
    of ``batch_size * world_size`` examples: 2 processes of 16 see what 1 process of 32 sees.
    """

    def __init__(
        self, data: TensorDataset, batch_size: int, seed: int, start_step: int = 0, world_size: int = 1, rank: int = 0
    ) -> None:
        self.x, self.y = data.tensors
        self.batch_size = batch_size
        self.seed = seed
        self.world_size = world_size
        self.rank = rank
        self.global_batch = batch_size * world_size
        self.num_batches = len(self.x) // self.global_batch
        if self.num_batches == 0:
            raise ValueError(
                f"ResumableBatches: a global batch of {self.global_batch} examples does not fit in a training "
                f"split of {len(self.x)}; accepted: batch_size * world_size <= the split size"
            )
        self.next_step = start_step

    def __len__(self) -> int:
        return self.num_batches

    # Lightning stores this in checkpoints and hands it back on resume. The position itself comes from
    # the global step (see above); the layout must not have changed, or the steps would map to other data.
    def state_dict(self) -> dict:
        return {"seed": self.seed, "global_batch": self.global_batch, "num_batches": self.num_batches}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(
                f"ResumableBatches: the checkpoint's training batches were {state}; this run's are "
                f"{self.state_dict()}; accepted: the same seed, global batch and split size to resume"
            )

    def __iter__(self):
        epoch, offset = divmod(self.next_step, self.num_batches)
        order = epoch_order(len(self.x), self.seed, epoch)
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        for b in range(offset, self.num_batches):
            idx = order[b * self.global_batch : (b + 1) * self.global_batch][lo:hi]
            self.next_step = epoch * self.num_batches + b + 1
            yield self.x[idx], self.y[idx]


class SplitData(L.LightningDataModule):
    """Deterministic splits (``self.train``, ``self.val``, ``self.test``, set by the subclass); training
    batches in an order fixed by ``shuffle_seed``, resumable at any step. A subclass saves its
    constructor's arguments as hyper-parameters: they are kept in checkpoints, and a resume must see the
    same data."""

    train: TensorDataset
    val: TensorDataset
    test: TensorDataset

    def __init__(self, batch_size: int, shuffle_seed: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed

    def train_dataloader(self) -> ResumableBatches:
        # Lightning restores a checkpoint's global step before it asks for the training data.
        trainer = self.trainer
        if trainer is None:
            return ResumableBatches(self.train, self.batch_size, self.shuffle_seed)
        return ResumableBatches(
            self.train,
            self.batch_size,
            self.shuffle_seed,
            start_step=trainer.global_step,
            world_size=trainer.world_size,
            rank=trainer.global_rank,
        )

    def shard(self, split: TensorDataset) -> Dataset:
        """This process's rows of an evaluation split: under data parallelism, each process gets its own
        contiguous slice, the slices together holding every row exactly once (no padding, unlike a
        ``DistributedSampler``), so that a sum and a count reduced across processes give the exact mean.
        The trainer is built with ``use_distributed_sampler=False``, so Lightning adds no sampler."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return split
        rows = torch.tensor_split(torch.arange(len(split)), trainer.world_size)[trainer.global_rank]
        return Subset(split, rows.tolist())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.shard(self.val), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.shard(self.test), batch_size=self.batch_size)


class SyntheticRegressionData(SplitData):
    """The regression's splits (``make_splits``)."""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        batch_size: int,
        train_size: int,
        val_size: int,
        test_size: int,
        noise: float,
        seed: int,
        shuffle_seed: int,
    ) -> None:
        super().__init__(batch_size, shuffle_seed)
        self.save_hyperparameters()
        self.train, self.val, self.test = make_splits(
            input_dim, output_dim, (train_size, val_size, test_size), noise, seed
        )


class TextData(SplitData):
    """``train_size``, ``val_size`` and ``test_size`` windows of ``seq_len`` bytes from the training,
    validation and test files of ``text.SPLIT_FILES`` (whole files per split, so no window of one split
    overlaps another's text), at offsets drawn from ``seed`` (``seed + 1``, ``seed + 2`` for validation and
    test)."""

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        train_size: int,
        val_size: int,
        test_size: int,
        seed: int,
        shuffle_seed: int,
    ) -> None:
        super().__init__(batch_size, shuffle_seed)
        self.save_hyperparameters()
        sizes = {"train": train_size, "val": val_size, "test": test_size}
        text = {split: split_bytes(split) for split in sizes}
        for split, data in text.items():
            if len(data) <= seq_len:
                raise ConfigError(
                    f"model.seq_len is {seq_len}; accepted: fewer than the {len(data)} bytes of the {split} "
                    "split's files (training/text.py)"
                )
        # The text is the running Python's standard library: a resume checks that it is the same bytes.
        self.hparams["text_sha256"] = hashlib.sha256(b"".join(t.numpy().tobytes() for t in text.values())).hexdigest()
        self.train, self.val, self.test = (
            TensorDataset(*windows(text[split], seq_len, size, seed + i))
            for i, (split, size) in enumerate(sizes.items())
        )
