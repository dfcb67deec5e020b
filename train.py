"""Train Linear -> RMSNorm -> SiLU -> Linear, or a small language model, on a chosen RMSNorm path.

python train.py                              # the defaults (conf/config.yaml): Triton path, seed 0
python train.py norm=reference seed=3 trainer.max_steps=200 data.batch_size=64
python train.py -m norm=reference,triton     # both paths from the same seed, then a side-by-side summary
python train.py model=transformer -m norm=reference,native,triton   # the language model on every path
"""

import os
import signal
import sys


def _stopped_while_starting(signum, frame):
    # Ctrl+C or SIGTERM while the imports below run (seconds: torch): one line, as
    # rmsnorm_kernel.signals gives python -m commands (importing it would import torch first).
    print(f"train.py: stopped by {signal.Signals(signum).name} while starting; nothing was done", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)


if __name__ == "__main__":
    for _s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_s) is not signal.SIG_IGN:  # ignored in a shell's background job: stays so
            signal.signal(_s, _stopped_while_starting)

from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from rmsnorm_kernel.training import config  # noqa: E402, F401  (registers the typed schema before Hydra composes)
from rmsnorm_kernel.training.cli import flags_first, override_problem  # noqa: E402
from rmsnorm_kernel.training.cli import main as train_main  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    return train_main(cfg)


if __name__ == "__main__":
    for _s, _then in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(_s) is _stopped_while_starting:  # started: as below, and as the run takes them
            signal.signal(_s, _then)
    try:
        sys.argv[1:] = flags_first(sys.argv[1:])
        problem = override_problem(sys.argv[1:], Path(__file__).resolve().parent / "conf")
        if problem is not None:
            print(f"train.py: configuration error: {problem}", file=sys.stderr, flush=True)
            sys.exit(2)
        main()
    except KeyboardInterrupt:  # Ctrl+C outside a run (composing, between the jobs of a multirun)
        print("train.py: stopped by SIGINT", file=sys.stderr, flush=True)
        sys.exit(130)
