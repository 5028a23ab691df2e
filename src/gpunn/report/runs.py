"""The rows of finished runs, as every experiment's report reads them: one tidy row per training run (run_row),
speedups and accuracy differences against baseline runs, report order, notes, and the evaluation's sample figure."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.nn.models import model_spec
from gpunn.report import divergence, figures, sources, spread, tables, titles
from gpunn.report.tables import format_ratio, ordered_variants
from gpunn.runspec import RunSpec, format_widths

read_json = sources.read_json  # one reader, one error line, for every report input


def run_row(run_dir) -> dict:
    """One tidy row describing a finished training run."""
    path = Path(run_dir) / "metrics.json"
    summary = read_json(path)
    try:
        return _run_row(summary)
    except KeyError as exc:
        raise GpunnError(f"{path}: lacks key {exc}; rerun its training step") from None
    except GpunnError as exc:  # a spec the run path grammar no longer reads
        raise GpunnError(f"{path}: {exc}; rerun its training step") from None


def _run_row(summary: dict) -> dict:
    """The spec, sizes, times and final metrics of a run; its device and whether it ran under the simulator
    (unknown and false for runs recorded before metrics.json had provenance); the MLP's input and output sizes
    for titles; its repeat (RunSpec.repeat, 0: the run itself) and timing mode (timing_mode). The testing time is
    None for runs recorded before it was measured; the peak GPU memory in bytes is None where the run did not
    record it (CPU variants, the simulator, older runs); whether it diverged and ended at chance
    (gpunn.report.divergence)."""
    spec = RunSpec.from_dict(summary["spec"])
    return {
        "dataset": spec.dataset, "split": spec.split, "model": spec.model, "variant": spec.variant,
        "widths": format_widths(spec.widths), "batch": spec.batch, "lr": spec.lr,
        "epochs": spec.epochs, "seed": spec.seed, "n_train": summary["n_train"], "n_test": summary["n_test"],
        "parameters": summary["num_parameters"], "train_time_s": summary["total_train_time_s"],
        "time_per_epoch_s": summary["mean_epoch_time_s"], "test_time_s": summary.get("test_time_s"),
        "block": spec.block, "reduction": spec.reduction, "repeat": spec.repeat,
        "forward_time_s": summary["forward_time_s"], "backward_time_s": summary["backward_time_s"],
        "final_train_loss": summary["final_train_loss"],
        "test_loss": summary["final_test_loss"], "test_accuracy": summary["final_test_accuracy"],
        **titles.device_fields(summary.get("provenance")),
        "timing_mode": timing_mode(summary.get("provenance")),
        "in_features": (None if model_spec(spec.model).square_images  # the MLP flattens its inputs: their size
                        else titles.mlp_in_features(summary, spec.widths[0])),
        "classes": summary.get("num_classes"),
        "peak_gpu_memory_bytes": summary.get("peak_gpu_memory_bytes"),
        **divergence.run_fields(summary),
    }


BASELINES = ("cpu-serial", "cpu-numpy")


def speedup_column(baseline: str) -> str:
    return f"speedup_vs_{baseline.replace('-', '_')}"


def baseline_value(frame: pd.DataFrame, baseline: str, column: str, keys: Sequence[str]) -> pd.Series:
    """For every row, `column` of the `baseline` variant's run with the same `keys`; NaN where it did not run."""
    of_baseline = frame[column].where(frame["variant"] == baseline)
    return of_baseline.groupby([frame[k] for k in keys]).transform("first")


# A speedup divides two clocks; it stands only where both ran alone (config key timing: isolated). Under timing:
# overlap a CPU-timed job ran beside GPU-timed ones (a 2 x H200 run: cpu-numpy's CNN epoch 42.2 s against 26.6 s
# alone, gpu-im2col's speedup 648x against 361x), and no check has yet shown such clocks comparable.
COMPARABLE_CLOCKS = ("isolated",)
TIMING_MODE_BEFORE = "isolated"  # runs recorded before provenance had timing_mode: timed jobs never overlapped then
# gpunn overlap-verdict's finding for the run being reported (trust_overlap): clocks timed under overlap compare like
# isolated ones only where it found every job kind of the run within its noise of the same run alone
_OVERLAP = {"trusted": False, "note": None}


def trust_overlap(path) -> None:
    """Read `path`, gpunn overlap-verdict's verdict.json for the reported run: when every job kind was within its
    noise, clocks timed under overlap compare like isolated ones in this process (clocks_comparable), and clock_note
    says on what evidence; else they stay apart and clock_note names the kinds outside their noise."""
    verdict = read_json(Path(path))
    try:
        kinds = [(k["model"], k["variant"], bool(k["within_noise"])) for k in verdict["kinds"]]
        machine, commit, repeats = verdict["machine"], verdict["commit"], int(verdict["repeats"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GpunnError(f"{path}: not a verdict of gpunn overlap-verdict ({exc}); run it again") from None
    outside = [f"{model} {variant}" for model, variant, within in kinds if not within]
    evidence = (f"gpunn overlap-verdict ({machine}, code at {commit}) timed each of the run's {len(kinds)} job kinds "
                f"alone in {repeats} rounds")
    if stale := _rerun_since(Path(path), machine, verdict.get("runs") or {}):
        _OVERLAP.update(trusted=False, note=f"{evidence}, but {stale} has been trained again since: run "
                                            "gpunn overlap-verdict again to compare its clocks.")
        return
    _OVERLAP["trusted"] = bool(kinds) and not outside
    _OVERLAP["note"] = (f"Clocks timed under overlap are compared like isolated ones: {evidence}, and every kind's "
                        "time in the run was within the alone runs' band." if _OVERLAP["trusted"] else
                        f"{evidence}: {titles.join_words(outside)} outside the alone runs' band.")


def _rerun_since(path: Path, machine: str, runs: dict) -> str | None:
    """The first run the verdict at `path` (<results>/overlap-verdict/<machine>/verdict.json) judged whose
    metrics.json is gone or from another training than the one it judged (finished_at); None when every run it judged
    is still there; "every run" when it names none."""
    root = path.resolve().parents[2] / "runs" / machine
    for run, finished_at in runs.items():
        metrics = root / run / "metrics.json"
        if not metrics.is_file() or read_json(metrics).get("finished_at") != finished_at:
            return run
    return None if runs else "every run"


def timing_mode(provenance) -> str:
    """The config key `timing` a run was timed under (its provenance's timing_mode, or a timing CSV row's; missing,
    None or NaN: TIMING_MODE_BEFORE)."""
    mode = (provenance if provenance is not None else {}).get("timing_mode")
    return TIMING_MODE_BEFORE if mode is None or pd.isna(mode) or not str(mode).strip() else str(mode)


def clocks_comparable(*modes) -> bool:
    """Whether runs timed under `modes` (None or NaN: recorded before the mode, TIMING_MODE_BEFORE) may be divided
    into a speedup."""
    comparable = COMPARABLE_CLOCKS + (("overlap",) if _OVERLAP["trusted"] else ())
    return all(timing_mode({"timing_mode": mode}) in comparable for mode in modes)


def speedup(frame: pd.DataFrame, baseline: str, column: str, keys: Sequence[str]) -> pd.Series:
    """The `baseline` run's `column` (same `keys`) over each row's: NaN without the baseline, and where either
    clock is not comparable (clocks_comparable: a run timed beside other jobs); clock_note says which."""
    ratio = baseline_value(frame, baseline, column, keys) / frame[column]
    modes = frame["timing_mode"] if "timing_mode" in frame else pd.Series(TIMING_MODE_BEFORE, index=frame.index)
    base_modes = baseline_value(frame.assign(timing_mode=modes), baseline, "timing_mode", keys)
    ok = [pd.isna(b) or clocks_comparable(m, b) for m, b in zip(modes, base_modes)]
    return ratio.where(ok)


def clock_note(frame: pd.DataFrame) -> str | None:
    """One line naming the runs whose clocks no speedup is taken from (None: every run timed alone), or the evidence
    on which runs timed under overlap are compared (trust_overlap)."""
    if "timing_mode" not in frame:
        return None
    apart = frame[[not clocks_comparable(m) for m in frame["timing_mode"]]]
    if apart.empty:
        overlapped = _OVERLAP["trusted"] and (frame["timing_mode"] == "overlap").any()
        return _OVERLAP["note"] if overlapped else None
    labels = tables.run_labels(apart) if "reduction" in apart else apart["variant"]
    named = titles.join_words(list(dict.fromkeys(f"{label} ({mode})" for label, mode in
                                                 zip(labels, apart["timing_mode"]))))
    return (f"No speedup is computed from the clocks of {named}: timed beside other jobs (config key timing), they "
            "are not shown comparable with any other run's; their speedup columns read '-'. Rerun them with timing: "
            "isolated to compare times, or time each job kind alone with gpunn overlap-verdict." +
            (f" {_OVERLAP['note']}" if _OVERLAP["note"] else ""))


def add_baseline_comparisons(frame: pd.DataFrame, keys: Sequence[str],
                             baselines: Sequence[str] = BASELINES) -> pd.DataFrame:
    """Speedup in training time over each of the `baselines` (default: the CPU ones) run with the same `keys`
    (speedup: NaN without the baseline or a comparable clock), and the test-accuracy comparison with cpu-numpy's
    run (add_accuracy_comparison)."""
    frame = frame.copy()
    for baseline in baselines:
        frame[speedup_column(baseline)] = speedup(frame, baseline, "train_time_s", keys)
    return add_accuracy_comparison(frame, baseline_value(frame, "cpu-numpy", "test_accuracy", keys))


def add_accuracy_comparison(frame: pd.DataFrame, reference: pd.Series) -> pd.DataFrame:
    """`frame` with the test-accuracy difference to `reference` (cpu-numpy's accuracy for each row, NaN where it
    did not run) in percentage points, and whether it lies within the row's run-to-run band (spread.with_bands'
    accuracy_band_pp; None where that is unknown and the difference is not zero)."""
    diff = 100.0 * (frame["test_accuracy"] - reference)
    bands = frame["accuracy_band_pp"] if "accuracy_band_pp" in frame else pd.Series(np.nan, index=frame.index)
    matches = [spread.within(d, b) for d, b in zip(diff, bands)]
    return frame.assign(accuracy_diff_vs_cpu_numpy_pp=diff, accuracy_matches_cpu_numpy=matches)


def measured_runs(runs, keys: Sequence[str]) -> pd.DataFrame:
    """run_row's frame of `runs` (run folders, repeats among them), with each run's metrics.csv: the runs
    themselves (repeat 0), each with its setting's run-to-run band (spread.with_bands over `keys`)."""
    every = pd.DataFrame([run_row(r) for r in runs]).assign(metrics_csv=metrics_paths(runs))
    primary, _ = spread.split_repeats(every)
    return spread.with_bands(primary, every, keys)


def sorted_rows(frame: pd.DataFrame, columns: Sequence[str], appearance: Sequence[str] = ()) -> pd.DataFrame:
    """Rows ordered by `columns`, the variant column in report order (baselines first), not alphabetically, and
    the columns in `appearance` in the order their values first appear (the config's order of datasets)."""
    ranks = {"variant": {v: i for i, v in enumerate(ordered_variants(frame["variant"]))}}
    ranks.update({c: {v: i for i, v in enumerate(dict.fromkeys(frame[c]))} for c in appearance})
    return frame.sort_values(list(columns), key=lambda col: col.map(ranks[col.name]) if col.name in ranks else col,
                             kind="stable").reset_index(drop=True)


def one_run_each(frame: pd.DataFrame, experiment: str, keys: Sequence[str]) -> None:
    """Refuse two runs of one variant with the same `keys`: a table or figure would show one of them."""
    repeated = frame[frame.duplicated(["variant", *keys])]
    if not repeated.empty:
        first = repeated.iloc[0]
        at = ", ".join(f"{k} {first[k]}" for k in keys)
        raise GpunnError(f"{experiment} has two runs of {first['variant']} at {at}; "
                         f"keep one per variant, {titles.join_words(keys)}")


def times(value) -> str:
    return format_ratio(value)


def comparison_formats(baselines: Sequence[str] = BASELINES) -> dict:
    """Markdown formats of add_baseline_comparisons' columns: speedups as '125x', differences as '+0.05'."""
    return {speedup_column(b): times for b in baselines} | {"accuracy_diff_vs_cpu_numpy_pp": "{:+.2f}"}


COMPARISON_FORMATS = comparison_formats()
COMPARISON_NOTE = ("Speedup: the baseline's training time over the variant's, on the same data with the same "
                   "settings. accuracy_diff_vs_cpu_numpy_pp: test accuracy minus cpu-numpy's in percentage points. "
                   f"{spread.NOTE} '-' elsewhere: that baseline did not run.")


def join_notes(*lines: str | None) -> str:
    return "\n\n".join(line for line in lines if line)


def samples_missing(path: Path, out_png) -> bool:
    """True when an evaluation's samples.npz is missing but the figure drawn from it is there: a results tree returned
    from another machine without its .npz files, whose report job drew the figure (gpunn publish --rebuild keeps it);
    a missing samples.npz without the figure is one error line."""
    if path.is_file():
        return False
    if Path(out_png).is_file():
        print(f"gpunn report: kept {out_png}: {path} is not here (a results tree returned without .npz files)",
              file=sys.stderr)
        return True
    raise GpunnError(f"{path}: missing; run the evaluate step first")


def samples_figure(eval_dir, out_png, title) -> None:
    path = Path(eval_dir) / "samples.npz"
    if samples_missing(path, out_png):
        return
    with np.load(path, allow_pickle=False) as saved:
        if "reconstructions" in saved:
            figures.reconstruction_grid(saved["images"], saved["reconstructions"], out_png, title)
        else:
            figures.sample_classifications(saved["images"], saved["labels"], saved["predictions"],
                                           [str(c) for c in saved["class_names"]], out_png, title)


def metrics_paths(runs) -> list[Path]:
    return [Path(r) / "metrics.csv" for r in runs]


def read_csvs(paths, columns, what) -> pd.DataFrame:
    """The CSVs' rows, with device and simulator columns normalised (filled in for CSVs written before the
    timings recorded their provenance)."""
    frame = pd.concat([tables.read_table(p, columns, what) for p in paths], ignore_index=True)
    return titles.with_device_fields(frame)


def metrics_csvs(frame: pd.DataFrame, group: str, label: str) -> dict[str, dict[str, Path]]:
    """{value of `group`: {value of `label`: that run's metrics.csv}} over the rows of `frame`, in its order."""
    groups: dict[str, dict[str, Path]] = {}
    for group_value, label_value, path in frame[[group, label, "metrics_csv"]].itertuples(index=False):
        groups.setdefault(str(group_value), {})[str(label_value)] = path
    return groups
