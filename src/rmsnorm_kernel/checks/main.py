"""``python -m rmsnorm_kernel <command>`` (installed as ``rmsnorm-kernel``): each claim as a command.

Every command prints a table, writes a JSON report to ``<outputs>/<command>.json`` (``--outputs``,
default ``outputs/`` in the current directory) and exits 0 when its checks hold, 1 when one fails,
2 on a usage problem. This module is the program: its parser, the checks of its arguments before any
work, and ``main``; what each command does is in ``commands``, the checks in one module per command
family (``campaigns``, ``negative``, ``checkpoint_audit``...). Timing the kernels is not one of these
commands: ``python -m benchmarks.benchmark``, from the repository.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..ops.contract import MAX_N
from . import campaigns, commands, figures
from .cli import USAGE, OneLineParser, at_least, run_interruptible
from .report import outputs_problem

# --------------------------------------------------------------------------------------------------
# Parser


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rmsnorm-kernel",
        description="Checks of the Triton RMSNorm kernel, one command per claim. Each prints a table, writes "
        "<outputs>/<command>.json and exits 0 when its checks hold, 1 when one fails.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--outputs",
        type=Path,
        default=Path("outputs"),
        help="directory for the JSON reports and other files (default: outputs)",
    )
    quick = argparse.ArgumentParser(add_help=False)
    quick.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(campaigns.QUICK_SHAPES)} shapes instead of {len(campaigns.FULL_SHAPES)} (x 3 dtypes), for CI",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")

    def add(name, handler, help_text, parents=(common,), **kw):
        p = sub.add_parser(name, help=help_text, description=help_text, parents=list(parents), **kw)
        p.set_defaults(handler=handler)
        return p

    add(
        "environment",
        commands.cmd_environment,
        "versions, GPU and driver (or none), backend, and one checked call of the Triton path",
    )
    add(
        "reference",
        commands.cmd_reference,
        "float64 gradcheck of the oracle, and its hand-written backward against autograd",
    )
    for command, campaign in commands.CAMPAIGN_COMMANDS.items():
        p = add(
            command,
            commands.campaign_command(command),
            f"{commands.CAMPAIGN_LABELS[campaign]} of the Triton path against the oracle: "
            f"{len(campaigns.FULL_SHAPES) * len(campaigns.DTYPES)} cases "
            "(irregular shapes, float32/float16/bfloat16, gamma not all ones)",
            parents=(common, quick),
        )
        kernels = sorted(campaigns.KERNELS[campaign])
        p.add_argument(
            "--kernel",
            choices=kernels,
            default="triton",
            help="the kernel under test"
            + (
                "; block-mean is the deliberately broken variant (denominator BLOCK), which must fail"
                if "block-mean" in kernels
                else ""
            ),
        )
    add(
        "negative",
        commands.cmd_negative,
        "every contract violation refused with ContractError before any kernel launch; "
        "the BLOCK-denominator mutant caught by the campaigns",
        parents=(common, quick),
    )
    add(
        "exercise",
        commands.cmd_exercise,
        "a row of 257 ones through the correct and the BLOCK-denominator kernels (0.9999995 vs 1.411458), "
        "the same at N = 256, and the broken backward",
    )
    p = add(
        "profile",
        commands.cmd_profile,
        "torch.profiler kernel counts of one forward and one forward+backward: reference, Triton, "
        "torch.compile(reference) (CPU operator counts without a GPU)",
    )
    p.add_argument(
        "--shape",
        type=at_least(1, int, MAX_N),
        nargs=2,
        metavar=("M", "N"),
        default=[64, 257],
        help=f"input shape, each from 1 to {MAX_N} (default: 64 257)",
    )
    add(
        "compile-report",
        commands.cmd_compile_report,
        "graph breaks under torch.compile(fullgraph=True) (must be 0), Inductor's code saved, "
        "and the op's opaque call in it",
    )
    figure_help = "\n".join(f"  {name}: {text}" for name, text in figures.FIGURES.items())
    p = add(
        "figures",
        commands.cmd_figures,
        "PNG figures into <outputs>/figures from the training runs and the check reports",
        epilog="figures:\n" + figure_help + "\n\nA figure whose inputs are missing is reported as skipped.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs", type=Path, default=Path("runs"), help="TensorBoard run directories of the training (default: runs)"
    )
    p = add(
        "check-checkpoints",
        commands.cmd_check_checkpoints,
        "load every checkpoint, check its keys, reproduce its recorded test outputs, and check what a resume "
        "needs (Adam, RNG, data position, loop counters, verdicts)",
    )
    p.add_argument(
        "--checkpoints",
        type=Path,
        default=Path("checkpoints"),
        help="directory searched for *.ckpt (default: checkpoints)",
    )
    p = add(
        "clean",
        commands.cmd_clean,
        "list (--dry-run) or remove the files this project's commands wrote in outputs/, runs/, checkpoints/ "
        "and multirun/ of the folder they were started in (and, at the project's root, .pytest_cache and "
        "__pycache__), file by file, and the folders left empty; every other file is kept and listed, and so "
        "is a run a live process is writing (its lock is held)",
        parents=(),
    )
    p.add_argument(
        "--scope", choices=["generated"], required=True, help="what to remove: 'generated' is the only scope"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list every file that would be removed and every file kept; remove and write nothing",
    )
    p.add_argument(
        "--outputs",
        type=Path,
        default=None,
        help="also write clean.json there; must lie outside the folders clean cleans (default: print only)",
    )
    p.add_argument(
        "--project",
        type=Path,
        default=Path("."),
        help="the folder the commands were started in, whose generated folders are cleaned; at the project's "
        "root (its pyproject.toml) the caches too (default: .)",
    )
    return parser


def argument_problem(args) -> str | None:
    """What is wrong with the parsed ``args`` of a command, checked before any of its work; None when nothing.
    (argparse already refused the unknown options, values outside the choices and malformed numbers.)"""
    if args.command == "clean":
        from . import clean

        return clean.argument_problem(args.project, args.outputs)
    for option in ("runs", "checkpoints"):  # folders a command reads
        folder = getattr(args, option, None)
        if folder is not None and folder.exists() and not folder.is_dir():
            return f"--{option} {folder} is not a folder; accepted: a folder (a missing one: nothing to read)"
    return outputs_problem(args.outputs)  # last: it creates the folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(None if argv is None else [str(a) for a in argv])
    if args.command is None:
        parser.print_help()
        return USAGE
    prog = f"{parser.prog} {args.command}"

    def body() -> int:
        problem = argument_problem(args)
        if problem is not None:
            print(f"{prog}: {problem}", file=sys.stderr)
            return USAGE
        return args.handler(args)

    return run_interruptible(prog, body)


if __name__ == "__main__":
    raise SystemExit(main())
