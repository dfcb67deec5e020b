"""Train Linear -> RMSNorm -> SiLU -> Linear, or a small language model, on a chosen RMSNorm path.

python train.py                              # the defaults (conf/config.yaml): Triton path, seed 0
python train.py norm=reference seed=3 trainer.max_steps=200 data.batch_size=64
python train.py -m norm=reference,triton     # both paths from the same seed, then a side-by-side summary
python train.py model=transformer -m norm=reference,native,triton   # the language model on every path
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rmsnorm_kernel.training import config  # noqa: F401  (registers the typed schema before Hydra composes)
from rmsnorm_kernel.training.cli import flags_first, override_problem
from rmsnorm_kernel.training.cli import main as train_main


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    return train_main(cfg)


if __name__ == "__main__":
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
