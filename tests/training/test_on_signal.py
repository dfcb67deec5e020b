"""``last.ckpt`` when a signal stops a run: written in process 0's folder, and Lightning's announcement of
the stop naming the signal that came."""

import logging
import signal
from types import SimpleNamespace

import pytest

from rmsnorm_kernel.signals import LIGHTNING_SIGNAL_LOGGER
from rmsnorm_kernel.training.on_signal import SaveOnSignal


def test_on_a_signal_last_ckpt_is_named_in_process_0s_folder(tmp_path):
    # on another process the folder this process guessed may differ; Lightning hands every process
    # process 0's folder through the checkpoint callback
    saved = []
    trainer = SimpleNamespace(
        received_sigterm=True,
        global_step=7,
        checkpoint_callback=SimpleNamespace(dirpath=str(tmp_path / "version_0")),
        save_checkpoint=lambda path, weights_only: saved.append(path),
    )
    on_signal = SaveOnSignal(tmp_path / "version_1")
    on_signal.on_exception(trainer, None, RuntimeError())
    assert saved == [tmp_path / "version_0" / "last.ckpt"] and (on_signal.saved, on_signal.step) == (saved[0], 7)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_lightnings_announcement_of_a_stop_names_the_signal_that_came(tmp_path, monkeypatch, signum):
    from .helpers import main, signal_after_step

    class Messages(logging.Handler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def emit(self, record):
            self.seen.append(record.getMessage())

    handler, log = Messages(), logging.getLogger(LIGHTNING_SIGNAL_LOGGER)
    log.addHandler(handler)
    signal_after_step(monkeypatch, 2, signum)
    try:
        with pytest.raises(SystemExit):
            main(tmp_path, "norm=reference")
    finally:
        log.removeHandler(handler)
    expected = {signal.SIGINT: "Received SIGINT: 2", signal.SIGTERM: "Received SIGTERM: 15"}[signum]
    assert [m.removeprefix("[rank: 0] ") for m in handler.seen if "Received" in m] == [expected]
