"""Run-to-run spread: what a report judges a difference between runs against, instead of a fixed threshold.

A variant that is not deterministic (float atomics: gpunn.backends.registry) runs each spec `spread_runs` times
(RunSpec.repeat 0, 1, ...: the same init and batch order, only the order of its sums differs). A setting's spread
(runs that share `keys`: dataset, widths, batch, reduction) pools those repeats over every such variant: the
standard deviation s of the test accuracy within each spec's runs, pooled, with df = runs - specs. Two single runs
of the setting that differ only in the rounding of their sums differ by less than

    band = t(0.975, df) * s * sqrt(2)

nineteen times in twenty; a larger difference is beyond the spread. The same band judges a deterministic variant
against another (their runs differ by one fixed summation order, a draw of the same rounding noise). Without
repeats the band is unknown (NaN) and a verdict says so. Tables show the runs themselves (repeat 0) only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gpunn.backends.registry import is_deterministic
from gpunn.report import titles

BAND_COLUMNS = ("accuracy_band_pp", "spread_runs", "spread_range_pp", "spread_variants")
SPREAD_KEY = "spread_runs"  # the config key: experiments.eN.spread_runs


@dataclass(frozen=True)
class Spread:
    """The pooled run-to-run spread of one setting's test accuracy, in percentage points."""

    runs: int                  # runs pooled (every repeat of every repeated spec)
    specs: int                 # specs with two runs or more
    sd: float                  # pooled standard deviation
    range_pp: float            # the largest max - min over one spec's runs
    variants: tuple[str, ...]  # the variants whose repeats it pools

    @property
    def df(self) -> int:
        return self.runs - self.specs

    @property
    def band(self) -> float:
        """The 95 % band of a difference between two single runs of the setting (t(0.975, df) * sd * sqrt 2)."""
        from scipy.stats import t  # scikit-learn's own dependency; only a report with repeats needs it

        return float(t.ppf(0.975, self.df) * self.sd * math.sqrt(2.0))


def split_repeats(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs themselves, every table's rows; the repeats, for the spread only) of run_row's frame; a frame
    without a repeat column (rows from before repeats) is all runs."""
    if "repeat" not in frame:
        return frame, frame.iloc[:0]
    repeat = frame["repeat"].fillna(0).astype(int)
    return frame[repeat == 0].reset_index(drop=True), frame[repeat > 0].reset_index(drop=True)


def setting_spreads(frame: pd.DataFrame, keys: Sequence[str]) -> dict[tuple, Spread]:
    """Spread per setting (the values of `keys`) of run_row's frame with its repeats: each non-deterministic
    variant's runs of one setting form a spec's group (runs 0, 1, ...); groups of two runs or more pool into the
    setting's Spread. Accuracies that are not finite (a diverged run) are left out."""
    spreads: dict[tuple, list] = {}
    rows = frame[[not is_deterministic(v) for v in frame["variant"]]] if len(frame) else frame
    for key, group in rows.groupby([*keys, "variant"], sort=False, dropna=False):
        points = 100.0 * pd.to_numeric(group["test_accuracy"], errors="coerce").dropna()
        if len(points) < 2:
            continue
        entry = spreads.setdefault(tuple(key[:-1]), [0, 0, 0.0, 0.0, []])
        entry[0] += len(points)
        entry[1] += 1
        entry[2] += float(((points - points.mean()) ** 2).sum())
        entry[3] = max(entry[3], float(points.max() - points.min()))
        entry[4].append(key[-1])
    return {key: Spread(runs, specs, math.sqrt(squares / (runs - specs)), widest, tuple(variants))
            for key, (runs, specs, squares, widest, variants) in spreads.items()}


def with_bands(primary: pd.DataFrame, every_run: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`primary` (the runs themselves) with BAND_COLUMNS: its setting's band, the runs it pools, their largest
    range and the variants repeated (NaN, 0 and '' where the setting has no repeats), and its own training time's
    lowest and highest over its repeats (train_time_low_s, train_time_high_s; NaN where it has none). `every_run`:
    the runs and their repeats, from which setting_spreads measures."""
    spreads = setting_spreads(every_run, keys)
    found = [spreads.get(tuple(row)) for row in primary[list(keys)].itertuples(index=False)]
    # each run's training time over its own repeats (a speedup's spread: paper_vs_ours.speedup_spread)
    times = every_run.groupby([*keys, "variant"], dropna=False)["train_time_s"]
    low, high, count = times.min(), times.max(), times.count()
    own = [tuple(row) for row in primary[[*keys, "variant"]].itertuples(index=False)]
    repeated = [count.get(k, 1) > 1 for k in own]
    primary = primary.assign(train_time_low_s=[low.get(k) if r else math.nan for k, r in zip(own, repeated)],
                             train_time_high_s=[high.get(k) if r else math.nan for k, r in zip(own, repeated)])
    return primary.assign(
        accuracy_band_pp=[s.band if s else math.nan for s in found],
        spread_runs=[s.runs if s else 0 for s in found],
        spread_range_pp=[s.range_pp if s else math.nan for s in found],
        spread_variants=[", ".join(s.variants) if s else "" for s in found])


def known(row) -> bool:
    """Whether a row of with_bands' frame (or of a summary.csv holding its columns) has a measured band."""
    band = row.get("accuracy_band_pp") if hasattr(row, "get") else None
    return band is not None and pd.notna(band) and int(row.get("spread_runs") or 0) > 0


def describe(row) -> str:
    """'±0.46 points (95 % band of a difference between two runs; 6 runs of gpu-naive and gpu-tiled, widest range
    0.15)' for a row with a known band."""
    variants = titles.join_words([v.strip() for v in str(row["spread_variants"]).split(",") if v.strip()])
    return (f"±{float(row['accuracy_band_pp']):.2f} points (95 % band of a difference between two runs; "
            f"{int(row['spread_runs'])} runs of {variants}, widest range {float(row['spread_range_pp']):.2f})")


def within(difference_pp: float, band_pp: float) -> bool | None:
    """Whether a difference in points lies within a band (None: the band is unknown and the difference not zero;
    an exact agreement needs no band). Accuracies are counts / n: the rounding of a difference is allowed for."""
    if pd.isna(difference_pp):
        return None
    if abs(difference_pp) < 1e-9:
        return True
    if pd.isna(band_pp):
        return None
    return bool(abs(difference_pp) <= band_pp + 1e-9)


def unknown(experiment: str) -> str:
    """Why a verdict is missing, and what to configure."""
    return (f"no run-to-run spread was measured (set experiments.{experiment}.{SPREAD_KEY} to 3 or more, with a "
            "non-deterministic variant such as gpu-naive among its variants)")


NOTE = ("accuracy_band_pp: the 95 % band of a difference between two runs of the same setting that differ only in "
        "the order of their sums, t(0.975, df) * s * sqrt(2), s pooled over the repeats (spread_runs runs) of the "
        "non-deterministic variants (spread_variants; widest max - min spread_range_pp); accuracy_matches_cpu_numpy: "
        "the difference lies within it ('-': no spread measured, set the experiment's spread_runs to 3 or more).")
