"""The sweep's run files merged into one, and what it says: worst ratios, noise and the targets.

``merge`` takes the files runs of ``benchmarks.sweep`` wrote (a run interrupted and finished with
``--skip-done``, or runs on several machines) and joins their rows; a point measured by two runs keeps
the first run's rows as its measurement and counts the others as repeats. ``markdown`` writes the report
beside the merged JSON:

- **worst ratios**, per regime, group (the split of the sweep's own points, fit or report; else the origin,
  with its split for the families that have one: ``group_of``) and direction: Triton's
  speed against the fastest correct peer at the same point (the peer's time divided by Triton's, so
  below 1 means Triton is slower), by GPU time and by whole call, and Triton's bandwidth as a share of
  the copy ceiling measured in the same run (GPU time);
- **noise**: for every point measured more than once (the noise points each run repeats at its end),
  implementation and direction, the spread (max - min) / min of its times; the stated noise is the
  largest GPU-time spread;
- **targets** (``targets``), each with its misses listed: forward at ``TARGET_PCT`` of the copy ceiling
  or more, and forward + backward likewise, at N in ``TARGET_N_RANGE`` (large regime); at least as fast
  as the fastest peer at every sweep point and every shape outside it (within the noise); on
  activation-sized inputs (x of ``ACTIVATION_BYTES`` or more: the large and ``act*`` regimes), each of
  ``ACTIVATION_TARGETS``; at least as fast as the fastest peer at every point of the other origins
  (narrow, activation, batch, wide, small); a host time per call at most ``HOST_RATIO_LIMIT`` times
  ``F.rms_norm``'s; the Triton path right everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from rmsnorm_kernel import tables
from rmsnorm_kernel.atomic import write_atomic

from ..common import keep_earlier_run, write_json
from ..impls import FWD, FWD_BWD, MODES
from . import results
from .measure import Row, best_ceilings
from .points import REGIME_BYTES, SHAPES, definition_hash, sweep_points

TARGET_PCT = {FWD: 92.0, FWD_BWD: 85.0}
TARGET_N_RANGE = (2048, 16384)
HOST_PEER, HOST_RATIO_LIMIT = "F.rms_norm", 1.5
DIRECTION = {FWD: "forward", FWD_BWD: "forward + backward"}
#: x of at least this many bytes (the smallest activation-sized regime) has its share of the copy ceiling
#: as a target.
ACTIVATION_BYTES = REGIME_BYTES["act64"]
#: (direction, lowest N, highest N, % of the copy ceiling) on activation-sized inputs.
ACTIVATION_TARGETS = ((FWD, 512, 65536, 90.0), (FWD_BWD, 512, 16384, 85.0), (FWD_BWD, 16385, 65536, 80.0))
REGIME_ORDER = ("large", "mid", "act64", "act128", "act256", "batch", "small", "tiny")
GROUP_ORDER = (
    "fit",
    "report",
    "outside",
    "wide",
    "narrow fit",
    "narrow report",
    "activation fit",
    "activation report",
    "batch fit",
    "batch report",
    "small",
)
#: The families of points whose own split (fit, report) the report keeps apart.
SPLIT_ORIGINS = ("narrow", "activation", "batch")
MERGED_JSON, MERGED_MD = "benchmark-sweep.json", "benchmark-sweep.md"
MERGED_KIND = "benchmark-sweep"


class MergeError(ValueError):
    """Run files that cannot be merged: unreadable, or from different sweeps."""


#: What every row of a run's file holds: ``measure.Row``'s fields without a default.
ROW_KEYS = tuple(f.name for f in dataclasses.fields(Row) if f.default is dataclasses.MISSING)


def load_runs(paths: Iterable[Path]) -> list[dict]:
    """The runs of the results files at ``paths`` (``results.read_runs``), each with its file as
    ``"file"``; MergeError, in one line, for a file that is not a results file of the sweep (or is
    damaged), and for a run given twice (by the same path, or as two copies: the same date, device and
    rows), which would count its rows as noise."""
    runs, seen, files = [], {}, set()
    for path in paths:
        if Path(path).resolve() in files:
            raise MergeError(f"{path} is given twice; accepted: each file once")
        files.add(Path(path).resolve())
        try:
            found = results.read_runs(path)
            for data in found:
                _check_run(data)
        except FileNotFoundError:
            raise MergeError(f"{path} does not exist; accepted: a results file of the sweep") from None
        except (OSError, ValueError, AttributeError) as exc:
            raise MergeError(f"{path} is not a sweep results file ({type(exc).__name__}: {exc})") from None
        for data in found:
            identity = (data.get("date"), data.get("device"), json.dumps(data["rows"], sort_keys=True))
            twin = seen.get(identity)
            if twin is not None:
                raise MergeError(f"{path} holds the same run as {twin}; accepted: each run once")
            seen[identity] = str(path)
            data["file"] = str(path)
            runs.append(data)
    return runs


def _check_run(data) -> None:
    """ValueError naming what makes ``data`` something other than a run's file of the sweep."""
    if data.get("shapes") not in SHAPES:
        raise ValueError(f"its shapes {data.get('shapes')!r} are none of {', '.join(SHAPES)}")
    for r in data["rows"]:
        missing = [k for k in ROW_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"a row lacks {', '.join(missing)}")
    ceilings = data.get("ceilings", [])
    if not isinstance(ceilings, list) or not all(isinstance(c, dict) and "regime" in c for c in ceilings):
        raise ValueError("its ceilings are not a list of a regime's measurements")


def group_of(row: dict) -> str:
    """fit or report for the sweep's own points; for the other families, where the point comes from, and
    its split where the family has one (``SPLIT_ORIGINS``)."""
    origin = row.get("origin", "?")
    if origin in ("sweep", "tiny"):
        return row["split"]
    return f"{origin} {row['split']}" if origin in SPLIT_ORIGINS else origin


def merge(runs: Sequence[dict]) -> dict:
    if not runs:
        raise MergeError("no run files to merge")
    sweeps = {(r.get("shapes"), r.get("definition")) for r in runs}
    if len(sweeps) > 1:
        raise MergeError(
            "the files come from different sweeps: "
            + "; ".join(f"{r['file']}: {r.get('shapes')} {r.get('definition')}" for r in runs)
        )
    shapes, definition = next(iter(sweeps))
    warnings = []
    for key in ("device", "torch", "triton", "liger_kernel"):
        values = sorted({str(r.get(key)) for r in runs})
        if len(values) > 1:
            warnings.append(f"the runs differ in {key}: {', '.join(values)}")
    rows, seen = [], set()
    for i, run in enumerate(runs):
        best = best_ceilings(run.get("ceilings", []))  # each run's rows against its own copy ceilings
        for r in run["rows"]:
            r = dict(r, session=i)
            if r.get("gpu_tbps") and best.get(r["regime"]):
                r["ceiling_tbps"] = best[r["regime"]]
                r["pct_of_ceiling"] = 100.0 * r["gpu_tbps"] / r["ceiling_tbps"]
            if r.get("repeat", 0) == 0:
                key = (r["point"], r["impl"], r["mode"])
                if key in seen:
                    r["repeat"] = 1  # measured again by a later run: one more sample of the noise
                seen.add(key)
            rows.append(r)
    ceilings = [dict(c, session=i) for i, run in enumerate(runs) for c in run.get("ceilings", [])]
    expected = sweep_points(shapes) if shapes else []
    measured = {r["point"] for r in rows if r.get("repeat", 0) == 0}
    if expected and definition_hash(expected) == definition:
        missing = [p.id for p in expected if p.id not in measured]
    else:
        missing = []
        warnings.append("this code's sweep differs from the runs' (another definition): missing points are not listed")
    first = runs[0]
    return dict(
        kind=MERGED_KIND,
        shapes=shapes,
        definition=definition,
        timed=any(r.get("timed") for r in runs),
        device=first.get("device"),
        torch=first.get("torch"),
        triton=first.get("triton"),
        liger_kernel=first.get("liger_kernel"),
        protocol=first.get("protocol"),
        runs=[
            dict(
                file=r["file"],
                date=r.get("date"),
                commit=r.get("commit"),
                elapsed_s=r.get("elapsed_s"),
                complete=r.get("complete"),
                skipped_done=r.get("skipped_done"),
                points=len({x["point"] for x in r["rows"] if x.get("repeat", 0) == 0}),
            )
            for r in runs
        ],
        warnings=warnings,
        missing=missing,
        ceilings=ceilings,
        rows=rows,
    )


# --------------------------------------------------------------------------------------------------
# What the merged rows say


def triton_ratios(rows: Iterable[dict]) -> list[dict]:
    """One record per Triton row (a point's measurement, not its repeats): its times, its share of the
    ceiling, and its speed against the fastest correct peer of the same measurement."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("repeat", 0) == 0:
            groups.setdefault((r.get("session", 0), r["point"], r["mode"]), []).append(r)
    out = []
    for rs in groups.values():
        t = next((r for r in rs if r["impl"] == "triton"), None)
        if t is None:
            continue
        peers = [r for r in rs if r["impl"] != "triton" and r.get("ok")]

        def fastest(key: str, peers=peers) -> dict | None:
            timed = [r for r in peers if r.get(key)]
            return min(timed, key=lambda r: r[key]) if timed else None

        rec = {
            k: t.get(k)
            for k in (
                "point",
                "regime",
                "origin",
                "split",
                "M",
                "N",
                "dtype",
                "mode",
                "ok",
                "detail",
                "gpu_us",
                "whole_us",
                "host_us",
                "gpu_tbps",
                "pct_of_ceiling",
            )
        }
        rec["group"] = group_of(t)
        for key, name in (("gpu_us", "gpu"), ("whole_us", "whole")):
            p = fastest(key)
            rec[f"peer_{name}"] = p["impl"] if p else None
            rec[f"peer_{name}_us"] = p[key] if p else None
            rec[f"vs_peer_{name}"] = p[key] / t[key] if p and t.get(key) else None
        host_peer = next((r for r in peers if r["impl"] == HOST_PEER and r.get("host_us")), None)
        rec["host_ratio"] = t["host_us"] / host_peer["host_us"] if host_peer and t.get("host_us") else None
        out.append(rec)
    return out


def _order(rec: dict) -> tuple:
    def idx(seq, v):
        return seq.index(v) if v in seq else len(seq)

    return idx(REGIME_ORDER, rec["regime"]), idx(GROUP_ORDER, rec["group"]), idx(MODES, rec["mode"])


def point_label(rec: dict) -> str:
    return f"{rec['dtype']} {rec['M']}x{rec['N']}"


def worst_table(ratios: Sequence[dict]) -> list[dict]:
    """Per (regime, group, mode): the lowest speed against the fastest peer (GPU and whole call) and the
    lowest share of the ceiling, with where each happens, and the median share."""
    keys = sorted(
        {(r["regime"], r["group"], r["mode"]) for r in ratios},
        key=lambda k: _order(dict(regime=k[0], group=k[1], mode=k[2])),
    )
    table = []
    for regime, group, mode in keys:
        recs = [r for r in ratios if (r["regime"], r["group"], r["mode"]) == (regime, group, mode)]
        entry = dict(regime=regime, group=group, mode=mode, points=len(recs))
        for key, name in (("vs_peer_gpu", "gpu"), ("vs_peer_whole", "whole")):
            have = [r for r in recs if r.get(key) is not None]
            w = min(have, key=lambda r: r[key]) if have else None
            entry[f"worst_vs_peer_{name}"] = w[key] if w else None
            entry[f"worst_vs_peer_{name}_at"] = f"{point_label(w)}, {w[f'peer_{name}']}" if w else None
        have = [r for r in recs if r.get("pct_of_ceiling") is not None]
        w = min(have, key=lambda r: r["pct_of_ceiling"]) if have else None
        entry["worst_pct"] = w["pct_of_ceiling"] if w else None
        entry["worst_pct_at"] = point_label(w) if w else None
        entry["median_pct"] = statistics.median(r["pct_of_ceiling"] for r in have) if have else None
        table.append(entry)
    return table


def _spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / min(values) if len(values) >= 2 and min(values) > 0 else None


def noise_summary(rows: Iterable[dict]) -> dict:
    """Spread of the times of every (point, impl, mode) measured more than once, per mode, and the stated
    noise: the largest GPU-time spread."""
    samples: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("ok") and r.get("gpu_us"):
            samples.setdefault((r["point"], r["impl"], r["mode"]), []).append(r)
    entries = []
    for (point, impl, mode), rs in samples.items():
        if len(rs) < 2:
            continue
        entries.append(
            dict(
                point=point,
                impl=impl,
                mode=mode,
                measurements=len(rs),
                runs=len({r.get("session", 0) for r in rs}),
                gpu_us=[r["gpu_us"] for r in rs],
                gpu_spread=_spread([r["gpu_us"] for r in rs]),
                whole_spread=_spread([r["whole_us"] for r in rs if r.get("whole_us")]),
            )
        )
    by_mode = {}
    for mode in MODES:
        es = [e for e in entries if e["mode"] == mode]
        g = [e["gpu_spread"] for e in es if e["gpu_spread"] is not None]
        w = [e["whole_spread"] for e in es if e["whole_spread"] is not None]
        by_mode[mode] = dict(
            series=len(es),
            measurements=sum(e["measurements"] for e in es),
            gpu_median=statistics.median(g) if g else None,
            gpu_max=max(g) if g else None,
            whole_median=statistics.median(w) if w else None,
            whole_max=max(w) if w else None,
        )
    gpu = [e["gpu_spread"] for e in entries if e["gpu_spread"] is not None]
    whole = [e["whole_spread"] for e in entries if e["whole_spread"] is not None]
    return dict(
        entries=entries,
        by_mode=by_mode,
        stated_gpu=max(gpu) if gpu else None,
        stated_whole=max(whole) if whole else None,
    )


def _miss(rec: dict, value, why: str) -> dict:
    return dict(point=rec["point"], mode=rec["mode"], label=point_label(rec), value=value, why=why)


def share_of_ceiling(limit: float):
    """The judge of a share-of-the-ceiling target: True at ``limit`` percent or more, else the miss."""

    def judge(rec):
        v = rec.get("pct_of_ceiling")
        if v is None:
            return _miss(rec, None, "no GPU time" if rec.get("ok") else f"wrong result: {rec.get('detail')}")
        return True if v >= limit else _miss(rec, v, f"{v:.1f}% of the copy ceiling, under {limit:.0f}%")

    return judge


def targets(ratios: Sequence[dict], noise: float | None) -> list[dict]:
    """The targets of the module docstring, each with the records it covers, how many meet it, and every
    miss. Speed against the peers counts as met within ``noise`` (a fraction)."""
    tol = noise or 0.0
    out = []

    def add(name: str, recs: list[dict], judge) -> None:
        misses, within = [], 0
        for rec in recs:
            verdict = judge(rec)
            if verdict is True:
                continue
            if verdict == "within noise":
                within += 1
                continue
            misses.append(verdict)
        out.append(
            dict(target=name, checked=len(recs), met=len(recs) - len(misses), within_noise=within, misses=misses)
        )

    lo, hi = TARGET_N_RANGE
    for mode in MODES:
        recs = [
            r
            for r in ratios
            if r["regime"] == "large" and r["origin"] == "sweep" and lo <= r["N"] <= hi and r["mode"] == mode
        ]
        limit = TARGET_PCT[mode]
        add(
            f"{DIRECTION[mode]} ≥ {limit:.0f}% of the copy ceiling at N {lo}-{hi} "
            "(large regime, every dtype, GPU time)",
            recs,
            share_of_ceiling(limit),
        )

    def vs_peer(rec):
        v = rec.get("vs_peer_gpu")
        if v is None:
            if not rec.get("ok"):
                return _miss(rec, None, f"wrong result: {rec.get('detail')}")
            return True if rec.get("peer_gpu") is None and rec.get("gpu_us") else _miss(rec, None, "no GPU time")
        if v >= 1.0:
            return True
        if v >= 1.0 - tol:
            return "within noise"
        return _miss(
            rec, v, f"{v:.2f}x the speed of {rec['peer_gpu']} ({rec['peer_gpu_us']:.1f} against {rec['gpu_us']:.1f} us)"
        )

    add(
        "every sweep point, both regimes: at least as fast as the fastest peer (GPU time, within the noise)",
        [r for r in ratios if r["origin"] == "sweep"],
        vs_peer,
    )
    add(
        "shapes outside the sweep (between its points and N > 16384): at least as fast as the fastest peer "
        "(GPU time, within the noise)",
        [r for r in ratios if r["origin"] == "outside"],
        vs_peer,
    )

    activation = [r for r in ratios if REGIME_BYTES.get(r["regime"], 0) >= ACTIVATION_BYTES]
    for mode, lo_n, hi_n, limit in ACTIVATION_TARGETS:
        add(
            f"{DIRECTION[mode]} ≥ {limit:.0f}% of the copy ceiling at N {lo_n}-{hi_n}, x of "
            f"{ACTIVATION_BYTES >> 20} MiB or more (GPU time)",
            [r for r in activation if r["mode"] == mode and lo_n <= r["N"] <= hi_n],
            share_of_ceiling(limit),
        )
    add(
        "the shapes users run beyond the sweep (narrow rows, activation-sized x, small batches, wide rows, the "
        "benchmark's small shapes): at least as fast as the fastest peer (GPU time, within the noise)",
        [r for r in ratios if r["origin"] in ("narrow", "activation", "batch", "wide", "small")],
        vs_peer,
    )

    def host(rec):
        v = rec.get("host_ratio")
        if v is None:
            return True  # no F.rms_norm host time to compare with
        return True if v <= HOST_RATIO_LIMIT else _miss(rec, v, f"host time {v:.2f}x F.rms_norm's")

    add(
        f"host time per call at most {HOST_RATIO_LIMIT}x F.rms_norm's (whole call)",
        [r for r in ratios if r.get("host_ratio") is not None],
        host,
    )
    add(
        "the Triton path is right at every point (float64 oracle)",
        list(ratios),
        lambda rec: True if rec.get("ok") else _miss(rec, None, rec.get("detail") or "wrong"),
    )
    return out


def summarize(merged: dict) -> dict:
    ratios = triton_ratios(merged["rows"])
    noise = noise_summary(merged["rows"])
    return dict(ratios=ratios, worst=worst_table(ratios), noise=noise, targets=targets(ratios, noise["stated_gpu"]))


# --------------------------------------------------------------------------------------------------
# Markdown


def _r(v, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0f}%"


def _frac(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def ceiling_lines(ceilings: Iterable[dict]) -> list[str]:
    by_regime: dict[str, list[dict]] = {}
    for c in ceilings:
        by_regime.setdefault(c["regime"], []).append(c)
    lines = []
    for regime, cs in by_regime.items():
        gpu = [c["gpu_tbps"] for c in cs if c.get("gpu_tbps")]
        whole = [c["whole_tbps"] for c in cs if c.get("whole_tbps")]
        if gpu:
            lines.append(
                f"- {regime} ({cs[0]['bytes'] / 2 / 2**20:.0f} MiB copied): GPU {min(gpu):.2f}-{max(gpu):.2f} TB/s, "
                f"whole call {min(whole):.2f}-{max(whole):.2f} TB/s, over {len(gpu)} measurements; rows use the fastest"
            )
    return lines


WORST_HEAD = (
    "regime",
    "points",
    "mode",
    "n",
    "vs fastest peer, GPU",
    "at",
    "vs fastest peer, whole call",
    "at",
    "% of ceiling, worst",
    "at",
    "% of ceiling, median",
)
NOISE_HEAD = ("mode", "series", "measurements", "GPU, median", "GPU, max", "whole call, median", "whole call, max")


def markdown(merged: dict, summary: dict | None = None) -> str:
    s = summary or summarize(merged)
    out = [
        f"# Benchmark sweep: {merged.get('device')}",
        "",
        f"torch {merged.get('torch')}, Triton {merged.get('triton')}, liger-kernel {merged.get('liger_kernel')}; "
        f"sweep `{merged.get('shapes')}` ({merged.get('definition')}).",
        "",
    ]
    for run in merged["runs"]:
        el = run.get("elapsed_s")
        commit = f", commit {run['commit']}" if run.get("commit") else ""
        out.append(
            f"- `{Path(run['file']).name}` ({run['date']}{commit}): {run['points']} points, "
            f"{'' if el is None else f'{el:.0f} s, '}{'complete' if run.get('complete') else 'INCOMPLETE'}"
        )
    out += [f"- warning: {w}" for w in merged.get("warnings", [])]
    if not merged.get("timed"):
        out += ["", "No timings: these runs had no CUDA GPU (correctness only)."]
    cl = ceiling_lines(merged.get("ceilings", []))
    if cl:
        out += ["", "Copy ceiling (device-to-device `copy_`, bytes read + written):", *cl]
    out += [
        "",
        "## Worst ratios",
        "",
        "Speed against the fastest correct peer at the same point: the peer's time divided by Triton's "
        "(below 1: Triton slower). GPU: CUDA-graph replays; whole call: eager calls with their host work. "
        "Share of the ceiling: GPU time.",
        "",
    ]
    out.append(
        tables.table(
            WORST_HEAD,
            [
                (
                    e["regime"],
                    e["group"],
                    e["mode"],
                    e["points"],
                    _r(e["worst_vs_peer_gpu"]),
                    e["worst_vs_peer_gpu_at"] or "–",
                    _r(e["worst_vs_peer_whole"]),
                    e["worst_vs_peer_whole_at"] or "–",
                    _pct(e["worst_pct"]),
                    e["worst_pct_at"] or "–",
                    _pct(e["median_pct"]),
                )
                for e in s["worst"]
            ],
            markdown=True,
        )
    )
    n = s["noise"]
    out += [
        "",
        "## Noise",
        "",
        "Points measured more than once (each run repeats the noise points at its end): "
        "spread (max - min) / min of the times of one implementation and direction.",
        "",
    ]
    out.append(
        tables.table(
            NOISE_HEAD,
            [
                (
                    mode,
                    b["series"],
                    b["measurements"],
                    _frac(b["gpu_median"]),
                    _frac(b["gpu_max"]),
                    _frac(b["whole_median"]),
                    _frac(b["whole_max"]),
                )
                for mode, b in n["by_mode"].items()
            ],
            markdown=True,
        )
    )
    out += [
        "",
        f"Stated noise (largest GPU-time spread): {_frac(n['stated_gpu'])}; whole call: {_frac(n['stated_whole'])}.",
    ]
    out += ["", "## Targets", ""]
    for t in s["targets"]:
        within = f", {t['within_noise']} of them within the noise" if t["within_noise"] else ""
        out.append(f"- **{t['target']}**: {t['met']} of {t['checked']} met{within}.")
        for m in t["misses"]:
            out.append(f"  - miss: {m['label']} {m['mode']}: {m['why']}")
    out += ["", "## Coverage", ""]
    out.append(
        f"- points missing from the runs: {len(merged.get('missing', []))}"
        + (f" ({', '.join(merged['missing'])})" if merged.get("missing") else "")
    )
    failed_peers: dict[str, int] = {}
    for r in merged["rows"]:
        if r["impl"] != "triton" and not r.get("ok") and r.get("repeat", 0) == 0:
            failed_peers[f"{r['impl']} {r['mode']}"] = failed_peers.get(f"{r['impl']} {r['mode']}", 0) + 1
    if failed_peers:
        out.append(
            "- peers failing the oracle check (not timed, no peer there): "
            + ", ".join(f"{k} at {v} point(s)" for k, v in sorted(failed_peers.items()))
        )
    prof = [r for r in merged["rows"] if r.get("gpu_method") == "profiler"]
    if prof:
        out.append(
            f"- GPU times from the profiler's kernel records instead of a CUDA graph: {len(prof)} row(s): "
            + ", ".join(sorted({f"{r['impl']} {r['mode']}" for r in prof}))
            + f" (first note: {prof[0].get('gpu_note')})"
        )
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------
# The merged files


def write_merged(merged: dict, outputs: Path) -> tuple[Path, Path]:
    """``benchmark-sweep.json`` (the merged rows with their summary) and ``benchmark-sweep.md`` in
    ``outputs``; earlier ones there are kept as ``.prev<n>`` (``keep_earlier_run``)."""
    s = summarize(merged)
    json_path, md_path = Path(outputs) / MERGED_JSON, Path(outputs) / MERGED_MD
    for path in (json_path, md_path):
        keep_earlier_run("sweep", path)
    write_json(json_path, dict(merged, noise=s["noise"], worst=s["worst"], targets=s["targets"]))
    write_atomic(md_path, markdown(merged, s))
    return json_path, md_path


def merged_paths_problem(outputs: Path) -> str | None:
    """Why the merged files cannot be written in ``outputs`` (None when they can): a folder where one of
    them goes, or a file where ``figures/`` goes."""
    for name in (MERGED_JSON, MERGED_MD):
        if (Path(outputs) / name).is_dir():
            return f"--outputs {outputs} holds a folder {name} where a merged file goes; accepted: a folder without it"
    figures = Path(outputs) / "figures"
    if figures.exists() and not figures.is_dir():
        return f"--outputs {outputs} holds a file named figures where the figures go; accepted: a folder without it"
    return None


# --------------------------------------------------------------------------------------------------
# The results page

#: The summary's groups of points, in its order: (label, regime or None for any, origins).
SUMMARY_GROUPS = (
    ("every hidden size 1000-16384, x of 512 MiB", "large", ("sweep",)),
    ("every hidden size 1000-16384, x of 32 MiB", "mid", ("sweep",)),
    ("between the sweep's sizes and past 16384", None, ("outside", "wide")),
    ("per-head and small-model rows, N 64-1024", None, ("narrow",)),
    ("activation-sized x, 64-256 MiB", None, ("activation",)),
    ("small batches, 64-2048 rows", None, ("batch", "small")),
)
SUMMARY_HEAD = (
    "shapes",
    "direction",
    "points",
    "median % of copy ceiling",
    "≥ fastest peer",
    "median vs peer",
    "worst",
)


def summary_rows(ratios: Sequence[dict], noise: float | None) -> list[tuple]:
    """Per group of ``SUMMARY_GROUPS`` and direction: its points, the median share of the copy ceiling,
    how many are at least as fast as the fastest correct peer (within ``noise``), and the median and
    lowest speed against it (GPU time)."""
    tol = noise or 0.0
    out = []
    for label, regime, origins in SUMMARY_GROUPS:
        for mode in MODES:
            recs = [
                r
                for r in ratios
                if r["origin"] in origins and r["mode"] == mode and (regime is None or r["regime"] == regime)
            ]
            if not recs:
                continue
            pct = [r["pct_of_ceiling"] for r in recs if r.get("pct_of_ceiling") is not None]
            vs = [r["vs_peer_gpu"] for r in recs if r.get("vs_peer_gpu") is not None]
            timed = [r for r in recs if r.get("vs_peer_gpu") is not None]
            worst = min(timed, key=lambda r: r["vs_peer_gpu"], default=None)
            out.append(
                (
                    label,
                    DIRECTION[mode],
                    len(recs),
                    _pct(statistics.median(pct)) if pct else "–",
                    f"{sum(v >= 1.0 - tol for v in vs)} of {len(vs)}",
                    _r(statistics.median(vs)) + "x" if vs else "–",
                    f"{worst['vs_peer_gpu']:.2f}x ({point_label(worst)}, {worst['peer_gpu']})" if worst else "–",
                )
            )
    return out


def _stamp(merged: dict) -> str:
    commits = sorted({str(run.get("commit") or "unknown") for run in merged["runs"]})
    dates = sorted(str(run.get("date"))[:10] for run in merged["runs"] if run.get("date"))
    when = dates[0] if dates and dates[0] == dates[-1] else (f"{dates[0]} to {dates[-1]}" if dates else "unknown")
    return (
        f"{merged.get('device')}; torch {merged.get('torch')}, Triton {merged.get('triton')}, liger-kernel "
        f"{merged.get('liger_kernel')}; commit {', '.join(commits)}; measured {when}, "
        f"{len(merged['runs'])} run(s)."
    )


def speed_page(merged: dict, command: str, figure: str | None) -> str:
    """The results page: what made it, on what, the figure, the summary by family of shapes, then the
    report (``markdown``) without its title."""
    s = summarize(merged)
    noise = s["noise"]["stated_gpu"]
    out = [
        "# Speed",
        "",
        f"Generated by `{command}` from the results file; not edited by hand.",
        "",
        _stamp(merged),
        "",
        "Each point is checked against the float64 oracle, then timed two ways: the GPU time (the call's "
        "kernels replayed from a CUDA graph, L2 flushed) and the whole call (eager calls with their host work). "
        "The peers are `F.rms_norm`, `torch.compile` of the reference, Liger-Kernel and a one-row-per-program "
        "kernel; the copy ceiling is a device-to-device copy of the same bytes. How the kernels get there: "
        "[design.md](design.md).",
        "",
    ]
    if figure:
        out += [f"![TB/s against N]({figure})", ""]
    out += [
        "## Summary",
        "",
        "GPU time. ≥ fastest peer: the points where Triton is at least as fast as the fastest correct peer, "
        f"within the noise ({_frac(noise)}, the largest spread of a point measured twice); vs peer: the peer's "
        "time over Triton's (below 1: Triton slower).",
        "",
        tables.table(SUMMARY_HEAD, summary_rows(s["ratios"], noise), markdown=True),
        "",
    ]
    body = markdown(merged, s).split("\n", 1)[1].lstrip("\n")
    return "\n".join(out) + "\n## The runs\n\n" + body
