"""The ``rmsnorm-kernel`` program (``checks.main``): its commands, and usage mistakes that end in one line
and exit status 2 before any work."""

import pytest

from rmsnorm_kernel.checks.main import main

from .helpers import WORK, patch_work

# --------------------------------------------------------------------------------------------------
# usage


@pytest.mark.parametrize("command", ["benchmark", "benchmark-sweep"])
def test_the_measurements_are_no_commands_of_the_package(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--quick"])
    assert exc.value.code == 2 and f"invalid choice: '{command}'" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "check-forward" in capsys.readouterr().out


def test_unknown_option_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["exercise", "--fast"])
    assert exc.value.code == 2 and "--fast" in capsys.readouterr().err


def test_an_outputs_folder_that_cannot_be_written_is_refused_with_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("kept")
    assert main(["exercise", "--outputs", str(tmp_path / "file" / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        f"--outputs {tmp_path}/file/x cannot be written (Not a directory); "
        "accepted: a folder this user can create and write"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def _status(argv) -> int:
    """The exit status of ``main(argv)``, whether it returns it or argparse exits."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code


def test_every_command_is_listed_here():
    from rmsnorm_kernel.checks.main import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(sub.choices) == set(WORK)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["profile", "--shape", "0", "5"], "too small"),
        (["profile", "--shape", "4", "-1"], "too small"),
        (["profile", "--shape", "4", "65537"], "too large"),
        (["profile", "--shape", "4", "x"], "is not a number"),
        (["check-forward", "--kernel", "nope"], "invalid choice"),
        (["check-checkpoints", "--checkpoints", "{file}"], "is not a folder"),
        (["figures", "--runs", "{file}"], "is not a folder"),
        (["clean", "--scope", "all"], "invalid choice"),
        *[([c, "--outputs", "{file}"], "is a file, not a folder") for c in sorted(WORK) if c != "clean"],
        (["clean", "--scope", "generated", "--outputs", "{file}"], "is a file, not a folder"),
    ],
)
def test_every_usage_mistake_is_one_line_and_exit_2_before_any_work(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("kept")

    def no_work(*args, **kwargs):
        raise AssertionError("the work started")

    patch_work(monkeypatch, argv[0], no_work)
    assert _status([a.replace("{file}", str(tmp_path / "a_file")) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and words in err, err
    assert err.startswith(f"rmsnorm-kernel {argv[0]}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
