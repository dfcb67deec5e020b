"""The synthetic data: fixed by their own seed, and training batches that can start again at any step."""

import pytest
import torch
from torch.utils.data import TensorDataset

from rmsnorm_kernel.training.data import ResumableBatches, SyntheticRegressionData, epoch_order, make_splits


def split(n=40, dim=3):
    x = torch.arange(n * dim, dtype=torch.float32).reshape(n, dim)
    return TensorDataset(x, -x)


def steps(batches, count):
    """The first ``count`` training batches, epoch after epoch: a new ``iter()`` per epoch, as Lightning asks."""
    out = []
    while len(out) < count:
        out += list(iter(batches))
    return out[:count]


def test_splits_depend_on_their_seed_alone():
    a = make_splits(4, 2, (8, 4, 4), noise=0.1, seed=7)
    torch.manual_seed(123)  # the global generator's state must not matter
    torch.rand(5)
    b = make_splits(4, 2, (8, 4, 4), noise=0.1, seed=7)
    c = make_splits(4, 2, (8, 4, 4), noise=0.1, seed=8)
    for sa, sb, sc in zip(a, b, c):
        assert all(torch.equal(ta, tb) for ta, tb in zip(sa.tensors, sb.tensors))
        assert not torch.equal(sa.tensors[0], sc.tensors[0])
    assert [len(s) for s in a] == [8, 4, 4]


def test_every_epoch_is_a_permutation_fixed_by_seed_and_epoch():
    first = epoch_order(20, seed=0, epoch=0)
    assert sorted(first.tolist()) == list(range(20))
    assert torch.equal(first, epoch_order(20, seed=0, epoch=0))
    assert not torch.equal(first, epoch_order(20, seed=0, epoch=1))
    assert not torch.equal(first, epoch_order(20, seed=1, epoch=0))


@pytest.mark.parametrize("start", [0, 3, 5, 9, 12])  # 5 batches an epoch: mid-epoch, epoch edges, third epoch
def test_batches_started_at_any_step_are_those_of_the_uninterrupted_run(start):
    data = split(n=40)
    whole = steps(ResumableBatches(data, batch_size=8, seed=4), 15)
    resumed = steps(ResumableBatches(data, batch_size=8, seed=4, start_step=start), 15 - start)
    assert len(resumed) == 15 - start
    for (xa, ya), (xb, yb) in zip(whole[start:], resumed):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_an_epoch_takes_every_example_once_in_full_batches():
    batches = ResumableBatches(split(n=43), batch_size=8, seed=0)
    seen = torch.cat([x[:, 0] for x, _ in batches])
    assert len(batches) == 5 and seen.numel() == 40  # the 3 examples past the last full batch wait
    assert seen.unique().numel() == 40


def test_two_processes_split_the_global_batch_of_one():
    data = split(n=64)
    one = steps(ResumableBatches(data, batch_size=16, seed=2), 6)
    ranks = [steps(ResumableBatches(data, batch_size=8, seed=2, world_size=2, rank=r), 6) for r in (0, 1)]
    for s in range(6):
        x = torch.cat([ranks[0][s][0], ranks[1][s][0]])
        assert torch.equal(x, one[s][0])
        assert not set(ranks[0][s][0][:, 0].tolist()) & set(ranks[1][s][0][:, 0].tolist())


def test_a_checkpoint_of_another_batch_layout_is_refused():
    batches = ResumableBatches(split(n=40), batch_size=8, seed=4)
    batches.load_state_dict({"seed": 4, "global_batch": 8, "num_batches": 5})  # its own: accepted
    with pytest.raises(ValueError, match="accepted: the same seed, global batch and split size to resume"):
        batches.load_state_dict({"seed": 4, "global_batch": 16, "num_batches": 2})


def test_a_global_batch_larger_than_the_split_is_refused():
    with pytest.raises(ValueError, match="a global batch of 48 examples does not fit in a training split of 40"):
        ResumableBatches(split(n=40), batch_size=24, seed=0, world_size=2)


def test_the_datamodule_shuffles_with_its_own_seed_and_keeps_the_splits():
    kw = dict(input_dim=4, output_dim=2, batch_size=4, train_size=16, val_size=8, test_size=8, noise=0.0, seed=1)
    a, b = SyntheticRegressionData(**kw, shuffle_seed=0), SyntheticRegressionData(**kw, shuffle_seed=1)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    xa, xb = next(iter(a.train_dataloader()))[0], next(iter(b.train_dataloader()))[0]
    assert not torch.equal(xa, xb)
    assert dict(a.hparams) == {**kw, "shuffle_seed": 0}  # what a checkpoint records for a resume to check
