"""The text corpus: the standard library's source files as bytes, split by whole files."""

import pytest
import torch

from rmsnorm_kernel.training import text


def test_splits_are_disjoint_sets_of_files_and_every_file_is_read():
    files = [f for split in ("train", "val", "test") for f in text.SPLIT_FILES[split]]
    assert len(files) == len(set(files))
    sizes = {split: len(text.split_bytes(split)) for split in ("train", "val", "test")}
    on_disk = {s: sum((text.stdlib_folder() / f).stat().st_size for f in text.SPLIT_FILES[s]) for s in sizes}
    assert sizes == on_disk and sizes["train"] > 1_000_000 and min(sizes.values()) > 50_000


def test_windows_are_reproducible_and_the_target_is_the_next_byte():
    data = text.split_bytes("val")
    x, y = text.windows(data, seq_len=16, count=5, seed=3)
    x2, y2 = text.windows(data, seq_len=16, count=5, seed=3)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (5, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < text.VOCAB_SIZE
    assert not torch.equal(x, text.windows(data, 16, 5, seed=4)[0])


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"needs .*argparse\.py, a file of Python's standard library"):
        text.split_bytes("train", folder=tmp_path)


def test_a_window_longer_than_the_text_is_refused():
    with pytest.raises(ValueError, match="the text has 10 bytes; a window needs more than seq_len = 10"):
        text.windows(torch.zeros(10, dtype=torch.uint8), seq_len=10, count=1, seed=0)
