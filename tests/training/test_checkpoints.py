"""Checkpoint files: atomic writes, leftovers of a killed writer, and the reader's checks."""

import zipfile

import pytest
import torch

from rmsnorm_kernel.training.checkpoints import (
    AtomicCheckpointIO,
    CheckpointError,
    atomic_torch_save,
    check_matches,
    read_checkpoint,
    remove_stale_temporaries,
)

from .helpers import full_disk_after

FULL = {
    "state_dict": {"w": torch.arange(6.0)},
    "hyper_parameters": {"hidden_dim": 8, "norm_impl": "triton"},
    "optimizer_states": [],
    "loops": {},
    "global_step": 3,
}


def test_atomic_save_interrupted_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"v": torch.arange(4)}, path)
    before = path.read_bytes()

    def dies_half_way(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the process is stopped while writing

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"v": torch.arange(8)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_lightning_saves_through_the_atomic_writer_and_the_file_reads_back(tmp_path):
    path = tmp_path / "sub" / "step00003.ckpt"
    AtomicCheckpointIO().save_checkpoint(FULL, path)
    assert [p.name for p in path.parent.iterdir()] == ["step00003.ckpt"]
    ckpt = read_checkpoint(path)
    assert torch.equal(ckpt["state_dict"]["w"], torch.arange(6.0)) and ckpt["global_step"] == 3
    with pytest.raises(TypeError, match="storage_options is {'a': 1}; accepted: None"):
        AtomicCheckpointIO().save_checkpoint(FULL, path, storage_options={"a": 1})


def test_stale_temporaries_are_removed_and_checkpoints_kept(tmp_path):
    (tmp_path / "last.ckpt").write_bytes(b"kept")
    (tmp_path / ".last.ckpt.4242.tmp").write_bytes(b"half")
    (tmp_path / "notes.tmp").write_bytes(b"not ours: no leading dot")
    removed = remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [".last.ckpt.4242.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "notes.tmp"]
    assert remove_stale_temporaries(tmp_path / "absent") == []


def test_read_checkpoint_refuses_a_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is not a file"):
        read_checkpoint(tmp_path)


def test_a_flipped_tensor_byte_fails_the_crc_check_that_torch_load_skips(tmp_path):
    path = tmp_path / "a.ckpt"
    torch.save(FULL, path)
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    # the record's bytes follow its local header: 30 bytes, then its name and extra field (lengths at 26, 28)
    name_len, extra_len = (
        int.from_bytes(data[info.header_offset + o : info.header_offset + o + 2], "little") for o in (26, 28)
    )
    data[info.header_offset + 30 + name_len + extra_len] ^= 0x01  # the first byte of the tensor
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # loads: the damage would go unnoticed without the CRC check
    with pytest.raises(
        CheckpointError, match=f"checkpoint {path} is corrupted \\(record .*/data/.* fails its CRC-32 check\\)"
    ):
        read_checkpoint(path)


def test_a_weights_only_file_is_not_a_training_checkpoint(tmp_path):
    path = tmp_path / "w.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}}, path)
    with pytest.raises(CheckpointError, match="missing: optimizer_states, loops, global_step"):
        read_checkpoint(path)
    assert read_checkpoint(path, required=("state_dict",))["state_dict"] == {}


@pytest.mark.parametrize(
    "expected,message",
    [
        ({"norm_impl": "reference"}, "was trained with norm path = 'triton'; the configuration asks for 'reference'"),
        ({"hidden_dim": 9, "norm_impl": "reference"}, "was trained with hidden_dim = 8; the configuration asks for 9"),
        ({"lr": 0.1}, "is not from this project's network \\(no hyper-parameter 'lr'\\)"),
    ],
)
def test_check_matches_names_the_first_mismatch(expected, message):
    with pytest.raises(CheckpointError, match=f"^checkpoint x.ckpt {message}$"):
        check_matches("x.ckpt", FULL, expected)
    check_matches("x.ckpt", FULL, {"hidden_dim": 8, "norm_impl": "triton"})  # its own: accepted


def test_a_hyper_parameter_a_checkpoint_may_lack_takes_its_default():
    """A checkpoint without ``dtype`` was trained in float32: it matches a float32 run and no other."""
    from rmsnorm_kernel.training.network import NETWORK_DEFAULTS

    check_matches("x.ckpt", FULL, {"dtype": "float32"}, NETWORK_DEFAULTS)
    with pytest.raises(
        CheckpointError, match="was trained with dtype = 'float32'; the configuration asks for 'bfloat16'"
    ):
        check_matches("x.ckpt", FULL, {"dtype": "bfloat16"}, NETWORK_DEFAULTS)


def test_a_full_disk_raises_the_oserror_naming_the_checkpoint_and_keeps_the_previous_file(tmp_path, monkeypatch):
    import errno

    from rmsnorm_kernel import atomic
    from rmsnorm_kernel.training import checkpoints

    path = tmp_path / "last.ckpt"
    atomic_torch_save(FULL, path)
    previous = path.read_bytes()
    full_disk_after(monkeypatch, atomic, "last.ckpt", writes=1)
    with pytest.raises(checkpoints.CheckpointWriteError) as error:
        atomic_torch_save({**FULL, "global_step": 4}, path)
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(path)
    assert path.read_bytes() == previous and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_the_last_good_checkpoint_is_the_furthest_with_finite_weights_and_optimizer_state(tmp_path):
    from rmsnorm_kernel.training.checkpoints import last_good_checkpoint

    def save(name, step, value):
        state = {**FULL, "global_step": step, "state_dict": {"w": torch.full((3,), value)}}
        atomic_torch_save({**state, "optimizer_states": [{"state": {0: {"exp_avg": torch.full((3,), value)}}}]}, name)

    source = tmp_path / "source.ckpt"
    save(source, 1, 1.0)
    run = tmp_path / "run"
    assert last_good_checkpoint(run, source) == source  # nothing written yet: the checkpoint resumed from
    run.mkdir()
    save(run / "step00002.ckpt", 2, 1.0)
    save(run / "step00003.ckpt", 3, float("inf"))  # the state that made the loss non-finite
    save(run / "last.ckpt", 3, float("nan"))
    assert last_good_checkpoint(run, source) == run / "step00002.ckpt"
    (run / "step00002.ckpt").write_bytes(b"damaged")
    assert last_good_checkpoint(run, source) == source
    assert last_good_checkpoint(run) is None
