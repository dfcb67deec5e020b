"""``python -m rmsnorm_kernel <command>`` (installed as ``rmsnorm-kernel``): each claim as a command.

Every command prints a table, writes a JSON report to ``<outputs>/<command>.json`` (``--outputs``,
default ``outputs/`` in the current directory) and exits 0 when its checks hold, 1 when one fails,
2 on a usage problem. The checks live in one module per command family (``campaigns``, ``negative``,
``checkpoint_audit``...); this module parses, prints and writes. Timing the kernels is not one of these
commands: ``python -m benchmarks.benchmark``, from the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import signals
from ..ops.backend import backend, kernel_device_type
from ..ops.contract import MAX_N
from ..ops.tolerances import TOLERANCES
from . import campaigns, checkpoint_audit, compile_report, environment, exercise, figures, gradients, negative, profile
from .report import WRITE_ERRNOS, cell, digits, dtype_name, format_table, outputs_problem, verdict, write_report

#: The check commands whose reports the figures read, with the campaign each runs.
CAMPAIGN_COMMANDS = {
    "check-forward": "forward",
    "check-backward": "dx",
    "check-gamma": "dgamma",
    "check-residual": "residual",
}
CAMPAIGN_LABELS = {
    "forward": "forward (y)",
    "dx": "backward (dx)",
    "dgamma": "backward (dgamma)",
    "residual": "fused residual add (y, h, dx, dresidual, dgamma)",
}

OK, FAILED, USAGE = 0, 1, 2
#: The exit status of a command stopped by a signal: 128 + the signal's number, as a shell reports it.
INTERRUPTED = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}


# --------------------------------------------------------------------------------------------------
# Usage mistakes: one line, exit status 2


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes end in one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(USAGE, f"{self.prog}: {message}\n")


def at_least(minimum: float, kind: type = int, maximum: float | None = None):
    """An argparse ``type``: a number of ``kind`` no smaller than ``minimum`` (and no larger than ``maximum``)."""
    accepted = f"{minimum} or more" if maximum is None else f"{minimum} to {maximum}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; accepted: {accepted}") from None
        if not math.isfinite(value):  # nan and inf parse as floats
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; accepted: {accepted}")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text} is too small; accepted: {accepted}")
        if maximum is not None and not value <= maximum:
            raise argparse.ArgumentTypeError(f"{text} is too large; accepted: {accepted}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


# --------------------------------------------------------------------------------------------------
# Ctrl+C and SIGTERM


Terminated = signals.Terminated


def interrupt_status(exc: BaseException) -> tuple[str, int]:
    """(signal name, exit status) of a ``KeyboardInterrupt`` or ``Terminated``."""
    name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    return name, INTERRUPTED[name]


def run_interruptible(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status; Ctrl+C (SIGINT) or SIGTERM, whatever ``body`` is doing, ends it with one
    line on stderr and exit status 130 or 143. SIGTERM is turned into ``Terminated`` while ``body`` runs,
    so its ``finally`` blocks and context managers run on the way out, as they do for Ctrl+C. A write the
    disk refuses (``WRITE_ERRNOS``: a full disk, a read-only file system) ends it with one line and exit
    status 1; files already written stay as they are.

    The one mechanism of every check command and of ``python -m benchmarks.*``. Before ``body``, while
    the command starts, ``signals.guard`` has the signals; after it, in a command, they are ignored, so
    that one arriving while Python shuts down cannot replace the status ``body`` decided
    (``signals.command_takes_over``)."""
    done = signals.command_takes_over()
    status = FAILED
    try:
        status = body()
    except (KeyboardInterrupt, Terminated) as exc:
        name, status = interrupt_status(exc)
        print(f"{prog}: stopped by {name}; exit status {status}", file=sys.stderr)
    except OSError as exc:  # a full disk, say, while writing results: one line, not a traceback
        if exc.errno not in WRITE_ERRNOS:
            raise
        cause = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write failed"
        where = exc.filename or "its output"
        print(f"{prog}: {cause}: {os.strerror(exc.errno)}, writing {where}; exit status {FAILED}", file=sys.stderr)
        status = FAILED
    finally:
        done()
    return status


# --------------------------------------------------------------------------------------------------
# Printing


def _finish(ok: bool, path: Path, what: str) -> int:
    print(f"\n{verdict(ok)}: {what}")
    print(f"report: {path}")
    return OK if ok else FAILED


def _header(title: str) -> None:
    where = "GPU (compiled Triton kernels)" if backend() == "cuda" else "CPU (Triton interpreter)"
    print(f"== {title} ==  backend: {backend()}, kernels on {where}\n")


def _tolerance_lines() -> str:
    return "tolerances (rmsnorm_kernel.ops.tolerances, allclose rule |a - e| <= atol + rtol * |e|): " + "; ".join(
        f"{dtype_name(d)} atol {t.atol:g} rtol {t.rtol:g}" for d, t in TOLERANCES.items() if d in campaigns.DTYPES
    )


# --------------------------------------------------------------------------------------------------
# Commands


def cmd_environment(args) -> int:
    _header("environment")
    facts = environment.environment_facts()
    print(format_table(["item", "value"], [(f.item, f.value) for f in facts]))
    print(
        f"\nproof that the Triton path runs here: one {environment.PROOF_SHAPE} "
        f"{dtype_name(environment.PROOF_DTYPE)} forward and backward against the oracle"
    )
    proof = environment.environment_proof()
    print(
        format_table(
            ["campaign", "dtype", "shape", "max abs", "max rel", "verdict", "error"],
            [(c.campaign, c.dtype, c.shape, c.max_abs, c.max_rel, verdict(c.ok), c.error) for c in proof],
        )
    )
    ok = all(c.ok for c in proof)
    path = write_report(args.outputs, "environment", ok, {"facts": {f.item: f.value for f in facts}, "proof": proof})
    return _finish(
        ok,
        path,
        "the Triton path computes the oracle's values on this machine" if ok else "the Triton path does not work here",
    )


def cmd_reference(args) -> int:
    _header("reference: the oracle's gradients")
    results = gradients.reference_checks()
    print(
        format_table(
            ["check", "dtype", "shape", "max abs", "max rel", "verdict", "detail"],
            [(r.check, r.dtype, r.shape, r.max_abs, r.max_rel, verdict(r.ok), r.detail) for r in results],
        )
    )
    ok = all(r.ok for r in results)
    path = write_report(args.outputs, "reference", ok, {"cases": results})
    return _finish(ok, path, f"{sum(r.ok for r in results)} of {len(results)} checks hold")


def _campaign_command(command: str) -> Callable:
    campaign = CAMPAIGN_COMMANDS[command]

    def run(args) -> int:
        shapes = campaigns.QUICK_SHAPES if args.quick else campaigns.FULL_SHAPES
        _header(f"{command}: {CAMPAIGN_LABELS[campaign]} of the {args.kernel} kernel against the float64 oracle")
        print(_tolerance_lines() + "\n")
        cases = campaigns.run_campaign(campaign, kernel=args.kernel, shapes=shapes)
        print(
            format_table(
                ["#", "dtype", "shape", "max abs", "max rel", "atol", "rtol", "verdict", "error"],
                [
                    (c.seed, c.dtype, c.shape, c.max_abs, c.max_rel, c.atol, c.rtol, verdict(c.ok), c.error)
                    for c in cases
                ],
            )
        )
        worst = campaigns.worst_per_dtype(cases)
        passed = sum(c.ok for c in cases)
        print(f"\n{passed} of {len(cases)} cases pass. Worst case per dtype:")
        for dt, c in worst.items():
            print(f"  {dt:9s} {cell(c.shape):14s} max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} ({verdict(c.ok)})")
        ok = passed == len(cases)
        path = write_report(
            args.outputs,
            command,
            ok,
            {
                "campaign": campaign,
                "kernel": args.kernel,
                "quick": args.quick,
                "tolerances": {dtype_name(d): dataclasses.asdict(t) for d, t in TOLERANCES.items()},
                "summary": {"cases": len(cases), "passed": passed, "worst_per_dtype": worst},
                "cases": cases,
            },
        )
        return _finish(ok, path, f"{CAMPAIGN_LABELS[campaign]}: {passed}/{len(cases)} cases within tolerance")

    return run


def cmd_negative(args) -> int:
    _header("negative: contract violations refused before any launch; the BLOCK-denominator mutant caught")
    results, mutant_cases = negative.negative_checks(
        mutant_shapes=campaigns.QUICK_SHAPES if args.quick else campaigns.FULL_SHAPES
    )
    print(
        format_table(
            ["kind", "case", "verdict", "outcome"], [(r.kind, r.name, verdict(r.ok), r.outcome) for r in results]
        )
    )
    ok = all(r.ok for r in results)
    path = write_report(args.outputs, "negative", ok, {"cases": results, "mutant_campaign_cases": mutant_cases})
    return _finish(ok, path, f"{sum(r.ok for r in results)} of {len(results)} negative checks hold")


def cmd_exercise(args) -> int:
    _header("exercise: mean over N, not over BLOCK = next_power_of_2(N)")
    rows = exercise.exercise()
    print(
        format_table(
            ["what", "N", "kernel", "value", "by hand", "max |diff| vs oracle", "agrees", "should agree", "verdict"],
            [
                (
                    r.what,
                    r.n,
                    r.kernel,
                    digits(r.value),
                    digits(r.predicted),
                    r.max_abs_vs_reference,
                    r.agrees_with_reference,
                    r.should_agree,
                    verdict(r.ok),
                )
                for r in rows
            ],
        )
    )
    print(
        "\nvalue: the first output coordinate (forward) or max |dx - dx_oracle| (backward).\n"
        "At N = 257 the broken kernel divides by BLOCK = 512: 1/sqrt(257/512 + eps) = 1.411458 instead of 0.9999995.\n"
        "At N = 256, BLOCK = N and the defect hides. "
        "The backward has its own two means: fixing only the forward is not enough."
    )
    ok = all(r.ok for r in rows)
    path = write_report(args.outputs, "exercise", ok, {"rows": rows})
    return _finish(
        ok,
        path,
        "each kernel behaves as worked out by hand" if ok else "a kernel does not behave as worked out by hand",
    )


def cmd_profile(args) -> int:
    _header("profile: kernel counts per path")
    rows = profile.profile_counts(shape=tuple(args.shape))
    unit = rows[0].unit if rows else ""
    if kernel_device_type() != "cuda":
        print(
            "No GPU: these are CPU operator counts (aten operators, Inductor C++ kernels), not GPU kernel launches.\n"
        )
    print(
        format_table(
            ["path", "phase", unit, "Triton op calls", "verdict", "detail"],
            [
                (
                    r.path,
                    r.phase,
                    r.count,
                    f"fwd {r.triton_calls['forward']}, bwd {r.triton_calls['backward']}",
                    verdict(r.ok),
                    r.detail,
                )
                for r in rows
            ],
        )
    )
    ok = all(r.ok for r in rows)
    path = write_report(args.outputs, "profile", ok, {"shape": list(args.shape), "unit": unit, "rows": rows})
    return _finish(
        ok,
        path,
        "each path profiled; the Triton path ran exactly once per phase" if ok else "a profile is not as expected",
    )


def cmd_compile_report(args) -> int:
    _header("compile-report: Linear -> RMSNorm (Triton) -> SiLU -> Linear under torch.compile(fullgraph=True)")
    code_dir = args.outputs / "compile-report"
    rep = compile_report.compile_report(code_dir)
    print(
        format_table(
            ["item", "value"],
            [
                ("graphs", rep.graph_count),
                ("graph breaks", rep.graph_break_count),
                ("break reasons", "; ".join(rep.break_reasons) or "none"),
                (
                    "Triton op calls in one compiled step",
                    f"fwd {rep.triton_calls['forward']}, bwd {rep.triton_calls['backward']}",
                ),
                ("compiled output vs eager, max abs", rep.max_abs_output),
                ("compiled gradients match eager", rep.grads_match),
                ("generated code saved", ", ".join(rep.code_files) or "none"),
            ],
        )
    )
    print("\nThe custom ops are called from Inductor's wrapper as extern calls, outside its generated kernels:")
    for excerpt in rep.excerpts:
        print("\n" + excerpt)
    for problem in rep.problems:
        print(f"\nproblem: {problem}")
    path = write_report(args.outputs, "compile-report", rep.ok, {"report": rep})
    return _finish(
        rep.ok,
        path,
        "no graph break; the op is one opaque call in the compiled code" if rep.ok else "see the problems above",
    )


def cmd_figures(args) -> int:
    print("== figures ==\n")
    reports = {CAMPAIGN_LABELS[c]: args.outputs / f"{cmd}.json" for cmd, c in CAMPAIGN_COMMANDS.items()}
    results = figures.make_figures(args.outputs / "figures", args.runs, reports)
    print(format_table(["figure", "status", "detail"], [(r.name, r.status, r.detail) for r in results]))
    written = [r for r in results if r.status == "written"]
    failed = [r for r in results if r.status == "failed"]
    ok = bool(written) and not failed
    path = write_report(args.outputs, "figures", ok, {"figures": results, "what_each_shows": figures.FIGURES})
    if not written:
        return _finish(False, path, "no figure could be drawn: none of their inputs exist yet")
    return _finish(
        ok,
        path,
        f"{len(written)} figure(s) in {args.outputs / 'figures'}"
        + (f"; {len(failed)} could not be drawn from their inputs" if failed else ""),
    )


def cmd_check_checkpoints(args) -> int:
    _header(f"check-checkpoints: every file under {args.checkpoints}/")
    results = checkpoint_audit.audit_checkpoints(args.checkpoints)
    audited = [r for r in results if r.stage != "skipped"]
    if results:
        print(
            format_table(
                ["file", "stage", "verdict", "max abs", "detail"],
                [
                    (r.file, r.stage, "-" if r.stage == "skipped" else verdict(r.ok), r.max_abs, r.detail)
                    for r in results
                ],
            )
        )
    ok = bool(audited) and all(r.ok for r in results)
    path = write_report(args.outputs, "check-checkpoints", ok, {"root": str(args.checkpoints), "files": results})
    if not audited:
        return _finish(
            False,
            path,
            f"no {checkpoint_audit.CHECKPOINT_SUFFIX} file under {args.checkpoints}: "
            "nothing was verified (run train.py first)",
        )
    bad = [r for r in audited if not r.ok]
    return _finish(
        ok,
        path,
        f"{len(audited) - len(bad)} of {len(audited)} checkpoint(s) verified"
        + (f"; failing: {', '.join(r.file for r in bad)}" if bad else ""),
    )


def cmd_clean(args) -> int:
    from . import clean

    root = Path(args.project).resolve()  # its arguments were checked before (argument_problem)
    try:
        entries = clean.clean_generated(root, dry_run=args.dry_run)
    except clean.CleanRefused as exc:
        print(exc, file=sys.stderr)
        return USAGE
    caches = "" if clean.is_project_root(root) else " (not the project's root: its caches are not cleaned)"
    print(f"== clean --scope {args.scope}{' --dry-run' if args.dry_run else ''} ==  folder: {root}{caches}\n")
    if entries:
        print(format_table(["path (relative to the folder)", "action"], [(r.path, r.action) for r in entries]))
    else:
        print("nothing generated to remove, nothing kept")
    gone = [r for r in entries if r.action in (clean.WOULD_REMOVE, clean.REMOVED)]
    failed = [r for r in entries if r.action.startswith("not removed")]
    kept = [r for r in entries if r.action.startswith("kept")]
    live = [r for r in kept if r.action.startswith(clean.KEPT_LIVE)]
    verb = "would be removed" if args.dry_run else "removed"
    print(
        f"\n{sum(not r.is_folder for r in gone)} file(s) and {sum(r.is_folder for r in gone)} folder(s) {verb}; "
        f"{len(kept)} path(s) kept"
        + (f", {len(live)} of them in use by a live process (a running training run) and left whole" if live else "")
        + (f"; {len(failed)} could not be removed" if failed else "")
    )
    if args.outputs is not None:  # never inside a cleaned folder: argument_problem refused that
        path = write_report(
            args.outputs,
            "clean",
            not failed,
            {
                "scope": args.scope,
                "dry_run": args.dry_run,
                "project": str(root),
                "in_use": [r.path for r in live],
                "paths": entries,
            },
        )
        print(f"report: {path}")
    return FAILED if failed else OK


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
        cmd_environment,
        "versions, GPU and driver (or none), backend, and one checked call of the Triton path",
    )
    add("reference", cmd_reference, "float64 gradcheck of the oracle, and its hand-written backward against autograd")
    for command, campaign in CAMPAIGN_COMMANDS.items():
        p = add(
            command,
            _campaign_command(command),
            f"{CAMPAIGN_LABELS[campaign]} of the Triton path against the oracle: "
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
        cmd_negative,
        "every contract violation refused with ContractError before any kernel launch; "
        "the BLOCK-denominator mutant caught by the campaigns",
        parents=(common, quick),
    )
    add(
        "exercise",
        cmd_exercise,
        "a row of 257 ones through the correct and the BLOCK-denominator kernels (0.9999995 vs 1.411458), "
        "the same at N = 256, and the broken backward",
    )
    p = add(
        "profile",
        cmd_profile,
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
        cmd_compile_report,
        "graph breaks under torch.compile(fullgraph=True) (must be 0), Inductor's code saved, "
        "and the op's opaque call in it",
    )
    figure_help = "\n".join(f"  {name}: {text}" for name, text in figures.FIGURES.items())
    p = add(
        "figures",
        cmd_figures,
        "PNG figures into <outputs>/figures from the training runs and the check reports",
        epilog="figures:\n" + figure_help + "\n\nA figure whose inputs are missing is reported as skipped.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs", type=Path, default=Path("runs"), help="TensorBoard run directories of the training (default: runs)"
    )
    p = add(
        "check-checkpoints",
        cmd_check_checkpoints,
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
        cmd_clean,
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
