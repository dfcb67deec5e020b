"""What each ``rmsnorm-kernel`` command does once its arguments are checked: run its checks (the modules
of its family), print a table (``tables.table``) and a verdict, write ``<outputs>/<command>.json``
(``report.write_report``), and return its exit status (``cli.OK``, ``cli.FAILED``)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from ..ops.backend import backend, kernel_device_type
from ..ops.tolerances import TOLERANCES
from ..tables import cell, table
from . import campaigns, checkpoint_audit, compile_report, environment, exercise, figures, gradients, negative, profile
from .cli import FAILED, OK, USAGE
from .report import digits, dtype_name, verdict, write_report

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
    print(table(["item", "value"], [(f.item, f.value) for f in facts]))
    print(
        f"\nproof that the Triton path runs here: one {environment.PROOF_SHAPE} "
        f"{dtype_name(environment.PROOF_DTYPE)} forward and backward against the oracle"
    )
    proof = environment.environment_proof()
    print(
        table(
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
        table(
            ["check", "dtype", "shape", "max abs", "max rel", "verdict", "detail"],
            [(r.check, r.dtype, r.shape, r.max_abs, r.max_rel, verdict(r.ok), r.detail) for r in results],
        )
    )
    ok = all(r.ok for r in results)
    path = write_report(args.outputs, "reference", ok, {"cases": results})
    return _finish(ok, path, f"{sum(r.ok for r in results)} of {len(results)} checks hold")


def campaign_command(command: str) -> Callable:
    campaign = CAMPAIGN_COMMANDS[command]

    def run(args) -> int:
        shapes = campaigns.QUICK_SHAPES if args.quick else campaigns.FULL_SHAPES
        _header(f"{command}: {CAMPAIGN_LABELS[campaign]} of the {args.kernel} kernel against the float64 oracle")
        print(_tolerance_lines() + "\n")
        cases = campaigns.run_campaign(campaign, kernel=args.kernel, shapes=shapes)
        print(
            table(
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
    print(table(["kind", "case", "verdict", "outcome"], [(r.kind, r.name, verdict(r.ok), r.outcome) for r in results]))
    ok = all(r.ok for r in results)
    path = write_report(args.outputs, "negative", ok, {"cases": results, "mutant_campaign_cases": mutant_cases})
    return _finish(ok, path, f"{sum(r.ok for r in results)} of {len(results)} negative checks hold")


def cmd_exercise(args) -> int:
    _header("exercise: mean over N, not over BLOCK = next_power_of_2(N)")
    rows = exercise.exercise()
    print(
        table(
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
        table(
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
        table(
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
    print(table(["figure", "status", "detail"], [(r.name, r.status, r.detail) for r in results]))
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
            table(
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
        print(table(["path (relative to the folder)", "action"], [(r.path, r.action) for r in entries]))
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
