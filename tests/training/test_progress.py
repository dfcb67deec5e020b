"""The progress bar of a run counts its training steps, also after a resume."""

import re


def test_the_progress_bar_counts_steps_of_max_steps_in_the_datas_epoch_also_after_a_resume(tmp_path, capsys):
    from .helpers import train

    bar = re.compile(r"Epoch (-?\d+)(?:/-?\d+)?: +\d+%\|[^|]*\| (\d+)/(\d+)")
    shown = []
    for steps, resume in ((6, []), (8, ["ckpt_path=last"])):  # 4 batches an epoch; the second from step 6
        train(tmp_path, "norm=reference", f"trainer.max_steps={steps}", "trainer.enable_progress_bar=true", *resume)
        text = capsys.readouterr().out
        assert "/-" not in text
        shown.append([(int(e), int(n), int(t)) for e, n, t in bar.findall(text)])
    straight, resumed = shown
    assert {t for _, _, t in straight} == {6} and {t for _, _, t in resumed} == {8}
    assert (0, 4, 6) in straight and straight[-1] == (1, 6, 6)
    assert resumed[0][:2] == (1, 6) and resumed[-1] == (1, 8, 8)
    assert all(n <= t for _, n, t in straight + resumed)
