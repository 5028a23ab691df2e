"""The divergence rule (gpunn.epochs.DivergenceRule) on prescribed losses and through the epoch loop with a stub
backend; a real run at a huge learning rate through `gpunn train` (one error line, exit 2, nothing written; with
--keep-diverged a finished run recorded as diverged); the reports' marks (summary columns, figure legend,
paper_vs_ours, the entry page) and the at-chance flag; keep_diverged from the config to the runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from gpunn.backends.base import Backend, EpochResult
from gpunn.cli import main as cli_main
from gpunn.config import load_config
from gpunn.epochs import DIVERGENCE_FACTOR, DivergenceRule, reference_loss, train_epochs
from gpunn.errors import GpunnError
from gpunn.evaluate import evaluate_run
from gpunn.report import divergence, index
from gpunn.report.build import make_report
from gpunn.runspec import parse_run_path
from gpunn.targets import experiment_runs, keep_diverged_runs

from test_report import _capture_figures, _epoch_csv, _md_rows
from test_train import _prepared

HUGE_LR_RUN = "digits8/standard/mlp/cpu-numpy/w8_b16_lr1e6_e2_s0"  # a finite loss of ~1e7 in the first epoch


# ------------------------------------------------------------------------------------------------ the rule
def test_factor_rule_fires_on_a_growing_but_finite_loss():
    rule = DivergenceRule("run x/y", lr=0.5, classes=10)
    for epoch, loss in enumerate([2.0, 5.0, 19.9], 1):  # up to 10x the first epoch's: still within the rule
        assert rule.check(epoch, loss) is None
    with pytest.raises(GpunnError) as error:
        rule.check(4, 20.5)
    message = str(error.value)
    assert message == ("training diverged: run x/y at learning rate 0.5: train loss 20.5 at epoch 4 is over 10x the "
                       "first epoch's loss (2); lower the learning rate or check the input data")
    assert DIVERGENCE_FACTOR == 10 and "\n" not in message


@pytest.mark.parametrize("classes, within, over", [(10, 23.0, 23.1), (2, 6.9, 7.0), (None, 10.0, 10.01)])
def test_first_epoch_is_held_against_the_loss_at_init(classes, within, over):
    """A 1-epoch run can diverge too: its loss against ln(classes) (a uniform guess), or 1 for the autoencoder."""
    assert reference_loss(classes) == (math.log(classes) if classes else 1.0)
    assert DivergenceRule("r", 1.0, classes).check(1, within) is None
    with pytest.raises(GpunnError, match="ln 10 = 2.303" if classes == 10 else "over 10x"):
        DivergenceRule("r", 1.0, classes).check(1, over)


def test_kept_divergence_is_recorded_once_and_only_a_non_finite_loss_stops():
    rule = DivergenceRule("r", 1.0, 10, keep=True)
    assert rule.record() == {"diverged": False, "diverged_epoch": None, "diverged_reason": None}
    rule.check(1, 1.0)
    found = rule.check(2, 50.0)
    assert found.epoch == 2 and not rule.stop  # finite: it trains on
    rule.check(3, 1e9)
    assert rule.record() == {"diverged": True, "diverged_epoch": 2,
                             "diverged_reason": "train loss 50 at epoch 2 is over 10x the first epoch's loss (1)"}
    assert rule.check(3, 0.5, kind="test") is None  # a finite test loss is no divergence
    rule.check(3, float("inf"), kind="test")
    assert rule.stop and rule.found.epoch == 2


class StubBackend(Backend):
    """A backend whose epochs return prescribed losses (no model, no data)."""

    name = "stub"

    def __init__(self, losses):
        super().__init__(model=None, model_name="mlp", lr=0.1)
        self.losses = list(losses)

    def load_train_data(self, x, y):
        pass

    def train_epoch(self, order, batch, progress=None):
        return EpochResult(self.losses.pop(0), 0.0, 0.0, 1)


def _epochs(losses, keep):
    rule = DivergenceRule("the stub", 0.1, 10, keep=keep)
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, np.int64)
    done = [(epoch, result.loss) for epoch, result, _ in
            train_epochs(StubBackend(losses), x, y, epochs=len(losses), batch=2, seed=0, rule=rule)]
    return done, rule


def test_the_epoch_loop_applies_the_rule():
    with pytest.raises(GpunnError, match=r"the stub at learning rate 0.1: train loss 30 at epoch 3 is over 10x"):
        _epochs([2.0, 1.0, 30.0, 1.0], keep=False)
    done, rule = _epochs([2.0, 1.0, 30.0, 1.0], keep=True)  # kept: all four epochs
    assert [e for e, _ in done] == [1, 2, 3, 4] and rule.found.epoch == 3
    done, rule = _epochs([2.0, float("nan"), 1.0], keep=True)  # NaN cannot train on: stops after epoch 2
    assert [e for e, _ in done] == [1, 2] and rule.stop and rule.record()["diverged_epoch"] == 2


# ------------------------------------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return _prepared(tmp_path_factory.mktemp("data"), "digits8")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_huge_learning_rate_stops_gpunn_train_with_one_line_and_no_outputs(digits, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(["train", HUGE_LR_RUN, "--data", str(digits), "--out", str(out)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(
        f"gpunn: error: training diverged: run {parse_run_path(HUGE_LR_RUN).path} at learning rate 1e6: train loss ")
    assert "at epoch 1 is over 10x the loss of a uniform guess over 10 classes" in errors[0]
    assert "keep_diverged: true (gpunn train --keep-diverged)" in errors[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.fixture(scope="module")
def kept(digits, tmp_path_factory):
    """The huge-lr run kept by --keep-diverged, its evaluation, and an E1 report and entry page over it."""
    root = tmp_path_factory.mktemp("kept")
    run = root / "runs" / HUGE_LR_RUN
    assert cli_main(["train", HUGE_LR_RUN, "--data", str(digits), "--out", str(run), "--keep-diverged"]) == 0
    evaluate_run(run, digits, root / "eval", log=lambda _: None)
    return root, run


def test_a_kept_diverged_run_trains_on_and_records_it(kept):
    _, run = kept
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["diverged"] is True and summary["diverged_epoch"] == 1 and summary["epochs_trained"] == 2
    reason = summary["diverged_reason"]
    assert reason.startswith("train loss ") and "at epoch 1 is over 10x" in reason
    assert list(pd.read_csv(run / "metrics.csv")["epoch"]) == [1, 2]  # finite: every epoch trained
    assert (run / "weights.npz").is_file()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_reports_and_the_entry_page_mark_a_kept_diverged_run(kept, monkeypatch):
    root, run = kept
    saved = _capture_figures(monkeypatch)
    out = root / "report"
    make_report("e1", out / "e1", runs=[run], evals=[root / "eval"])
    summary = pd.read_csv(out / "e1" / "summary.csv")
    assert summary["diverged"].tolist() == [True] and summary["at_chance"].tolist() == [True]
    header, rows = _md_rows(out / "e1" / "summary.md")
    assert dict(zip(header, rows[0]))["diverged"] == "True" and dict(zip(header, rows[0]))["at_chance"] == "True"
    note = "and the run was kept (keep_diverged): its numbers are not results"
    assert note in (out / "e1" / "summary.md").read_text()
    legends = [text for figure in saved for text in figure["legend"]]
    assert "cpu-numpy (diverged)" in legends  # loss_curves
    assert any("cpu-numpy\n(diverged)" in tick for figure in saved for ticks in figure["xticks"] for tick in ticks)
    paper = pd.read_csv(out / "e1" / "paper_vs_ours.csv")
    cpu = paper[(paper["quantity"] == "test_accuracy") & (paper["variant"].notna())].iloc[0]
    assert cpu["variant"] == "cpu-numpy (diverged)" and "our run diverged at epoch 1" in cpu["note"]
    page = index.write(out, ["e1"])["index.md"].read_text()
    assert "## Diverged runs" in page
    listed = "- E1: cpu-numpy, reduction mean, dataset digits8, widths 8, batch 16 ([e1/summary.md](e1/summary.md))"
    assert listed in page
    assert "| cpu-numpy (diverged) |" in page  # the headline it stands for
    assert "Diverged, kept by keep_diverged, not results: E1: cpu-numpy" in (out / "index.rst").read_text()


def test_block_study_legend_marks_the_diverged_block(tmp_path, monkeypatch):
    """E4's block figures: one line per block size; a block whose run diverged is marked in the legend."""
    from gpunn.report.figures import epoch_lines

    saved = _capture_figures(monkeypatch)
    lines = {"gpu-naive": {"128": _epoch_csv(tmp_path / "a.csv"), "1024": _epoch_csv(tmp_path / "b.csv", offset=1.0)}}
    epoch_lines(lines, ["train_loss"], tmp_path / "loss.png", "E4", legend_title="threads per block", ordinal=True,
                diverged={"1024"})
    assert saved[-1]["legend"] == ["128", "1024 (diverged)"]


def test_at_chance_flag_diverged_or_not():
    fields = divergence.run_fields({"spec": {"model": "mlp"}, "num_classes": 10, "final_test_accuracy": 0.149})
    assert fields == {"diverged": False, "diverged_epoch": None, "diverged_reason": None, "at_chance": True}
    assert divergence.run_fields({"spec": {"model": "cnn"}, "num_classes": 10,
                                  "final_test_accuracy": 0.15})["at_chance"] is False
    autoencoder = {"spec": {"model": "autoencoder"}, "num_classes": 10, "final_test_accuracy": float("nan")}
    assert divergence.run_fields(autoencoder)["at_chance"] is None


# ------------------------------------------------------------------------------------------------ the config
def test_keep_diverged_reaches_the_runs_of_any_experiment_that_keeps_them():
    config = load_config({"experiments": {"e4": {"keep_diverged": "true"}}}, gpu_name=lambda: None,
                         log=lambda _: None)
    assert config["experiments"]["e4"]["keep_diverged"] is True
    assert not any(config["experiments"][e]["keep_diverged"] for e in ("e1", "e2", "e5"))
    assert keep_diverged_runs(config) == {spec.path for spec in experiment_runs(config, "e4")}
    assert keep_diverged_runs(load_config({}, gpu_name=lambda: None, log=lambda _: None)) == set()
    # E6 encodes with an E5 run: E5's setting keeps it
    e5 = load_config({"experiments": {"e5": {"keep_diverged": True}}}, gpu_name=lambda: None, log=lambda _: None)
    assert {spec.path for spec in experiment_runs(e5, "e6")} <= keep_diverged_runs(e5)
