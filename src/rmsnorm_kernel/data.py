"""Synthetic regression data: a fixed random teacher network plus noise, generated from the data's own seed."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


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


class SyntheticRegressionData(L.LightningDataModule):
    """Deterministic splits; the training batches are shuffled by a generator seeded from ``shuffle_seed``."""

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
        super().__init__()
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self.train, self.val, self.test = make_splits(
            input_dim, output_dim, (train_size, val_size, test_size), noise, seed
        )

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.shuffle_seed)
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, drop_last=True, generator=generator)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)
