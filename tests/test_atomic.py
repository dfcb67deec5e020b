"""The one atomic write: a file is replaced whole or left as it was, and no temporary is left behind."""

import errno
import os

import pytest

from rmsnorm_kernel.atomic import temporary_path, write_atomic


def test_text_and_bytes_are_written_whole_in_folders_made_for_them(tmp_path):
    path = write_atomic(tmp_path / "a" / "b" / "r.json", "{}\n")
    assert path == tmp_path / "a" / "b" / "r.json" and path.read_text() == "{}\n"
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_the_temporary_is_hidden_beside_the_file_and_named_for_this_process(tmp_path):
    assert temporary_path(tmp_path / "last.ckpt") == tmp_path / f".last.ckpt.{os.getpid()}.tmp"


def test_the_file_is_renamed_into_place_from_its_temporary(tmp_path, monkeypatch):
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renamed.append((src, dst)), real_replace(src, dst)))
    path = write_atomic(tmp_path / "r.json", "x")
    assert renamed == [(temporary_path(path), path)]


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_a_write_the_disk_refuses_leaves_the_earlier_file_and_no_temporary(where, tmp_path, monkeypatch):
    path = write_atomic(tmp_path / "r.json", "earlier")

    def refused(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, where, refused)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "later, and longer")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and path.read_text() == "earlier"


def test_a_process_stopped_mid_write_leaves_the_earlier_file_and_no_temporary(tmp_path, monkeypatch):
    path = write_atomic(tmp_path / "r.json", "earlier")

    def stopped(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "later")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and path.read_text() == "earlier"
