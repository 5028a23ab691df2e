"""The report's entry page (gpunn.report.index), each report's provenance.json (gpunn.report.sources) and the
figures' captions (gpunn.report.captions): built from synthetic run folders, checked cell by cell."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpunn import experiments
from gpunn.cli import main as cli_main
from gpunn.config import load_config
from gpunn.errors import GpunnError
from gpunn.report import captions, index, sources
from gpunn.report.build import make_report
from gpunn.targets import EXPERIMENTS, index_args, index_setting, report_figures, synthetic_data_notes

from test_report import _cpu_and_h100, _cpu_and_simulated, _e1_results, _provenance

REPO = Path(__file__).resolve().parents[1]


def _e1_report(tmp_path, where=_cpu_and_h100, **spec_fields):
    runs, evals = _e1_results(tmp_path, ["cpu-serial", "cpu-numpy", "gpu-naive", "gpu-fused"], where=where,
                              spec_fields=spec_fields)
    root = tmp_path / "report"
    make_report("e1", root / "e1", runs=runs, evals=evals)
    return root


def _md_row(text: str, *first_cells: str) -> list[str]:
    """The cells of the Markdown table row that starts with `first_cells`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[: len(first_cells)] == list(first_cells):
            return cells
    raise AssertionError(f"no row {first_cells}")


# ----------------------------------------------------------------------------------------------- provenance
def test_report_provenance_merges_the_inputs_records(tmp_path):
    root = _e1_report(tmp_path)
    found = sources.read(root / "e1" / "provenance.json")
    assert found["experiment"] == "e1"
    by_device = {record["device"]: record for record in found["sources"]}
    assert set(by_device) == {"cpu", "NVIDIA H100 80GB HBM3"}
    assert by_device["cpu"]["used_by"] == ["cpu-numpy", "cpu-serial"] and by_device["cpu"]["count"] == 2
    assert by_device["NVIDIA H100 80GB HBM3"]["used_by"] == ["gpu-fused", "gpu-naive"]
    assert set(by_device["cpu"]) == {*sources.RECORD_KEYS, *sources.RUN_KEYS, "used_by", "count"}


def test_report_provenance_of_runs_recorded_before_provenance(tmp_path):
    root = _e1_report(tmp_path, where=None)
    (record,) = sources.read(root / "e1" / "provenance.json")["sources"]
    assert record["device"] == "unknown" and record["commit"] is None and record["count"] == 4


def test_report_provenance_reads_timing_csv_columns(tmp_path):
    csv = tmp_path / "gpu-fused.csv"
    prov = _provenance("NVIDIA H200")
    pd.DataFrame([{"batch": b, "step_ms": 1.0, **{k: prov.get(k) for k in sources.RECORD_KEYS if k in prov}}
                  for b in (1, 8)]).to_csv(csv, index=False)
    (record,) = sources.collect(timings=[csv])
    assert record["device"] == "NVIDIA H200" and record["used_by"] == ["e3 timing gpu-fused"] and record["count"] == 1


# ----------------------------------------------------------------------------------------------- index
def test_index_headlines_beside_the_papers_and_not_run_experiments(tmp_path):
    root = _e1_report(tmp_path, epochs=10)  # the paper's setting: its accuracies compare in points
    not_run = {e: f"experiments.{e}.enabled is false in this config" for e in EXPERIMENTS if e != "e1"}
    paths = index.write(root, ["e1"], not_run, notes=["a stated note"], machine="nvidia-h100")
    page = paths["index.md"].read_text()
    # paper 000's CPU row compares with cpu-serial (its CPU phase), the GPU row with gpu-naive
    cpu = _md_row(page, "E1", "000", "CPU test accuracy")
    assert cpu[3:6] == ["97.93 %", "97.93 %", "+0.00 pp"] and cpu[7] == "cpu-serial"
    gpu = _md_row(page, "E1", "000", "GPU test accuracy")
    assert gpu[3:6] == ["93.86 %", "97.95 %", "+4.09 pp"] and gpu[8] == "NVIDIA H100 80GB HBM3"
    speedup = _md_row(page, "E1", "000", "GPU speedup over the CPU")
    assert speedup[3] == "132.7x" and speedup[4] == "125x"  # cpu-serial 300 s over gpu-naive 2.4 s
    # with both sides' times per epoch, so that '0.942x' is not read as 'ours is slower'
    assert speedup[-1].startswith("per epoch, paper: GPU 0.225 s on NVIDIA Tesla T4, CPU 29.86 s on CPU (model not "
                                  "stated); ours: gpu-naive 0.24 s on NVIDIA H100 80GB HBM3, cpu-serial 30 s")
    assert "the baselines differ: the paper's CPU took 29.86 s an epoch, ours (cpu-serial) 30 s" in speedup[-1]
    for experiment in ("E2", "E3", "E4", "E5", "E6"):
        row = _md_row(page, experiment)
        assert row[2] == "-" and row[-1] == f"not run: experiments.{experiment.lower()}.enabled is false in this config"
    assert "- a stated note" in page and "cuda-simulator" not in page
    # each experiment headed by what its run trained (its summary's title), the paper's setting beside it
    setting = index.run_setting(root, "e1")
    assert setting and setting.startswith("MLP ") and ", timed on" not in setting
    assert f"### E1: {setting} (paper 000: {experiments.get('e1').title})" in page
    assert f"### E2: {experiments.get('e2').title} (paper 002)" in page  # not run: the paper's setting alone
    # links to every table and figure of the report that ran, each figure with its caption and its PDF
    for name in ("summary.md", "paper_vs_ours.md"):
        assert f"(e1/{name})" in page
    for figure in ("loss_curves.png", "epoch_time.png", "samples.png"):
        caption = experiments.get("e1").caption(figure).text()
        assert f"[{figure}](e1/{figure}) ([PDF](e1/{figure[:-4]}.pdf)): {caption}" in page
    # the provenance: both devices, their versions and the experiments that used them
    h100 = _md_row(page, "NVIDIA H100 80GB HBM3")
    assert h100[-1] == "E1"
    table = pd.read_csv(paths["index.csv"])
    assert list(table.columns) == list(index.INDEX_COLUMNS)
    assert len(table) == 3 + 5 and table["experiment"].tolist()[:3] == ["E1"] * 3
    front = paths["index.rst"].read_text()
    assert "CPU test accuracy" in front and ".. list-table::" in front and "Provenance" in front
    assert "{{" not in front and "{%" not in front  # Snakemake renders it as a Jinja template


def test_index_shows_no_accuracy_difference_for_a_run_not_in_the_papers_setting(tmp_path):
    """A smoke run (1 epoch on digits8_mini) against paper 000's 10 MNIST epochs: its accuracy stands beside the
    paper's, with no difference in points that would read as a failed reproduction; the note says how ours differs."""
    root = _e1_report(tmp_path, dataset="digits8_mini", epochs=1)
    paths = index.write(root, ["e1"])
    page = paths["index.md"].read_text()
    for headline in ("CPU test accuracy", "GPU test accuracy"):
        row = _md_row(page, "E1", "000", headline)
        assert row[5] == index.NOT_PAPER_SETTING == "- (not the paper's setting)" and "pp" not in row[5]
        assert row[-1].startswith("ours: digits8_mini, 1 epoch"), row
    assert _md_row(page, "E1", "000", "GPU speedup over the CPU")[5].startswith("ours / paper ")  # a ratio still
    assert "only where our run had the paper's setting" in page
    table = pd.read_csv(paths["index.csv"])
    assert table.loc[table["headline"] == "CPU test accuracy", "comparison"].item() == index.NOT_PAPER_SETTING
    ours = pd.read_csv(root / "e1" / "paper_vs_ours.csv")
    accuracy = ours[(ours["quantity"] == "test_accuracy") & (ours["row"] == "Test accuracy")]
    assert set(accuracy["our_setting"]) == {"digits8_mini, 1 epoch"} and accuracy["diff_pp"].notna().all()


def test_index_compares_a_time_without_the_papers_baseline_not_at_all(tmp_path):
    """E6's SVM fit time: the paper (cuML on Kaggle) times no CPU baseline, so there is no speedup to compare and an
    absolute time on other hardware is shown, not divided by the paper's; its accuracies compare in points."""
    from test_paper_vs_ours import e6_paper_setting_svm

    root = tmp_path / "report"
    make_report("e6", root / "e6", svm=[e6_paper_setting_svm(tmp_path)])
    page = index.write(root, ["e6"])["index.md"].read_text()
    fit = _md_row(page, "E6", "004", "SVM fit time (s)")
    assert fit[3:6] == ["46 s", "77.4 s", index.NO_BASELINE] and "ours / paper" not in fit[5]
    assert _md_row(page, "E6", "004", "SVM test accuracy")[5] == "+2.44 pp"  # the paper's setting: compared


def test_index_labels_simulated_rows(tmp_path):
    root = _e1_report(tmp_path, where=_cpu_and_simulated)
    page = index.write(root, ["e1"])["index.md"].read_text()
    assert _md_row(page, "E1", "000", "GPU test accuracy")[8] == "cuda-simulator"
    assert "ran under numba's CUDA simulator on the CPU: their times and speedups are not meaningful" in page


def test_index_without_a_report_names_the_missing_file(tmp_path):
    with pytest.raises(GpunnError, match=r"e4/paper_vs_ours.csv: missing; build E4's report first"):
        index.write(tmp_path, ["e4"])
    root = _e1_report(tmp_path)
    (root / "e1" / "provenance.json").unlink()
    with pytest.raises(GpunnError, match=r"provenance.json: missing"):
        index.write(root, ["e1"])
    assert not (root / "index.md").exists()  # nothing half-written
    with pytest.raises(GpunnError, match="unknown experiment"):
        index.write(root, ["e7"])


def test_index_cli_and_its_argument_errors(tmp_path, capsys):
    root = _e1_report(tmp_path)
    assert cli_main(["index", "--out", str(root), "--ran", "e1", "--not-run", "e2=a reason", "--machine", "m"]) == 0
    assert _md_row((root / "index.md").read_text(), "E2")[-1] == "not run: a reason"
    assert cli_main(["index", "--out", str(root), "--ran", "e1", "--not-run", "e2"]) == 2
    assert "write EXPERIMENT=REASON" in capsys.readouterr().err


def test_every_headline_names_one_paper_value():
    for experiment in experiments.ALL:
        assert experiment.headlines, experiment.name
        for headline in experiment.headlines:
            entry = experiment.headline_value(headline)  # raises unless exactly one value matches
            assert entry.experiment == headline.experiment == experiment.name and entry.quantity == headline.quantity


def test_index_args_say_why_experiments_and_gpu_rows_are_missing():
    raw = yaml.safe_load((REPO / "config/cpu.yaml").read_text())
    raw.setdefault("experiments", {}).setdefault("e5", {})["enabled"] = False
    cpu = load_config(raw, log=lambda line: None, gpu_name=lambda: None)
    args = index_args(cpu)
    assert args[args.index("--ran") + 1: args.index("--not-run")] == ["e1", "e2", "e3", "e4", "e6"]
    assert "e5=experiments.e5.enabled is false in this config" in args
    assert any(a.startswith("gpu.enabled is false") for a in args)


# ----------------------------------------------------------------------------------------------- captions
@pytest.mark.parametrize("config_file", ["config.yaml", "smoke.yaml", "cpu.yaml"])
def test_every_report_figure_has_a_caption_and_a_caption_file(config_file):
    config = load_config(yaml.safe_load((REPO / "config" / config_file).read_text()), log=lambda line: None,
                         gpu_name=lambda: None)
    for experiment in EXPERIMENTS:
        for figure in report_figures(config, experiment):
            found = experiments.get(experiment)
            assert found.caption(figure).shows.endswith(".") and found.caption(figure).paper.startswith("paper ")
            name = captions.rst_name(experiment, found.caption_key(figure))
            assert (REPO / "workflow/report/captions" / name).is_file()


def test_caption_files_are_generated_from_the_registry(tmp_path):
    """workflow/report/captions/ is exactly what `python -m gpunn captions` writes (regenerate it after editing
    an experiment's CAPTIONS)."""
    written = captions.write_rst(tmp_path, {e.name: e.captions for e in experiments.ALL})
    committed = REPO / "workflow/report/captions"
    assert sorted(p.name for p in written) == sorted(p.name for p in committed.glob("*.rst"))
    for path in written:
        assert path.read_text() == (committed / path.name).read_text(), path.name


def test_a_figure_without_a_caption_is_named():
    with pytest.raises(GpunnError, match="no caption for e1 figure 'new_figure.png'"):
        experiments.get("e1").caption("new_figure.png")
    e4 = experiments.get("e4")
    assert captions.rst_name("e4", e4.caption_key("samples_fashion_mnist.png")) == "e4_samples.rst"


def test_synthetic_data_notes_state_the_true_sizes():
    """A smaller synthetic dataset is 'in the real dataset's format, smaller', with both sizes; a full-size one keeps
    'format and size' (config/gpu_offline.yaml's synthetic_cifar10)."""
    smoke = load_config(yaml.safe_load((REPO / "config/smoke.yaml").read_text()), log=lambda line: None,
                        gpu_name=lambda: None)
    notes = index_setting(smoke)[2]
    mnist = next(n for n in notes if " ran on synthetic_mnist_small, " in n)
    assert ("generated offline in mnist's format, smaller (5 000 train / 1 000 test images against mnist's "
            "60 000 / 10 000)") in mnist and "format and size" not in mnist
    cifar = next(n for n in notes if " ran on synthetic_cifar10_small, " in n)
    assert "in cifar10's format, smaller (2 000 train / 500 test images against cifar10's 50 000 / 10 000)" in cifar
    raw = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    raw["experiments"]["e2"]["dataset"] = "synthetic_mnist"
    full = load_config(raw, log=lambda line: None, gpu_name=lambda: None)
    (note,) = synthetic_data_notes(full, ["e2"])
    assert "generated offline in mnist's format and size: their times are those of the real shapes and sizes" in note
