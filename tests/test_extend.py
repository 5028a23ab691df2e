"""The worked example of a new experiment (docs/development.md, How to extend): its module, schema block and config
block make an experiment that the config checks, the targets, the report and the entry page take with no other
change."""

import re
import types
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpunn import experiments, targets
from gpunn.config import load_config, load_schema
from gpunn.errors import GpunnError
from gpunn.report import index
from gpunn.report.build import make_report

from test_report import _cpu_and_simulated, _write_run

REPO = Path(__file__).resolve().parents[1]


def _block(marker: str, language: str) -> str:
    found = re.search(rf"<!-- how to extend: {marker} -->\n```{language}\n(.*?)```",
                      (REPO / "docs/development.md").read_text(), re.DOTALL)
    assert found, f"docs/development.md: no {language} block after '<!-- how to extend: {marker} -->'"
    return found.group(1)


@pytest.fixture
def e7(monkeypatch):
    """The example's e7.py as a module, added to the registry as it would find src/gpunn/experiments/e7.py."""
    module = types.ModuleType("gpunn.experiments.e7")
    exec(compile(_block("e7.py", "python"), "e7.py", "exec"), module.__dict__)
    monkeypatch.setattr(experiments, "ALL", experiments.ALL + (module.EXPERIMENT,))
    monkeypatch.setitem(experiments.BY_NAME, "e7", module.EXPERIMENT)
    return module.EXPERIMENT


def _config(block: dict) -> dict:
    """A config with the example's schema block (step 2) and `block` as experiments.e7 (step 3)."""
    schema = load_schema()
    schema["properties"]["experiments"]["properties"].update(yaml.safe_load(_block("schema", "yaml")))
    return load_config({"experiments": {"e7": block}}, schema=schema, log=lambda line: None, gpu_name=lambda: None)


def test_the_example_plans_its_runs_and_report(e7):
    config = _config({"enabled": True, "hidden": [64, 256], "variants": ["cpu-numpy", "gpu-graph"]})
    runs = targets.experiment_runs(config, "e7")
    assert [(r.variant, r.widths, r.dataset) for r in runs] == [
        ("cpu-numpy", (64,), "fashion_mnist"), ("cpu-numpy", (256,), "fashion_mnist"),
        ("gpu-graph", (64,), "fashion_mnist"), ("gpu-graph", (256,), "fashion_mnist")]
    outputs = [Path(p).name for p in targets.report_outputs(config, "e7")]
    assert outputs == ["summary.csv", "summary.md", "jobs.csv", "jobs.md", "loss_curves.png", "loss_curves.pdf",
                       "provenance.json"]
    assert targets.report_inputs(config, "e7") == {
        "runs": [f"{targets.Layout.of(config).run_dir(r)}/metrics.json" for r in runs]}
    assert e7.caption("loss_curves.png").paper == "paper 000 section 2.5"


def test_the_example_block_is_checked_like_any_other(e7):
    with pytest.raises(GpunnError, match="config key experiments.e7.variants.*'gpu-warp' is not a known variant"):
        _config({"variants": ["cpu-numpy", "gpu-warp"]})
    with pytest.raises(GpunnError, match="config key experiments.e7.dataset = 'mnist3'"):
        _config({"dataset": "mnist3"})
    with pytest.raises(GpunnError, match="config key experiments.e7.colour is unknown"):
        _config({"colour": "red"})


def test_the_example_report_and_entry_page(e7, tmp_path):
    results = tmp_path / "results"
    config = _config({"enabled": True, "epochs": 3, "variants": ["cpu-numpy", "gpu-graph"]})
    runs = [_write_run(results, spec, 6.0 if spec.variant == "cpu-numpy" else 2.0, 1.0, 1.0, 0.85,
                       provenance=_cpu_and_simulated(spec.variant)) for spec in targets.experiment_runs(config, "e7")]
    out = tmp_path / "report" / "e7"
    written = make_report("e7", out, runs=runs)
    assert set(written) == {"summary.md", "loss_curves.png"}
    summary = pd.read_csv(out / "summary.csv")
    assert list(zip(summary["variant"], summary["hidden"])) == [("cpu-numpy", 64), ("cpu-numpy", 256),
                                                                ("gpu-graph", 64), ("gpu-graph", 256)]
    assert summary["speedup_vs_cpu_numpy"].tolist() == pytest.approx([1.0, 1.0, 3.0, 3.0])
    assert (out / "loss_curves.png").stat().st_size > 0 and (out / "provenance.json").is_file()
    page = index.write(tmp_path / "report", ["e7"])["index.md"].read_text()
    assert "### E7: " in page and "(paper 000: MLP on Fashion-MNIST at two hidden sizes)" in page
    caption = e7.caption("loss_curves.png").text()
    assert f"[loss_curves.png](e7/loss_curves.png) ([PDF](e7/loss_curves.pdf)): {caption}" in page


def test_the_registry_finds_every_experiment_module_in_numeric_order(monkeypatch):
    assert [e.name for e in experiments.ALL] == ["e1", "e2", "e3", "e4", "e5", "e6"] == experiments._modules()
    found = [types.SimpleNamespace(name=n) for n in ("e10", "base", "e2", "e9", "e1x", "e1")]
    monkeypatch.setattr(experiments.pkgutil, "iter_modules", lambda path: found)
    assert experiments._modules() == ["e1", "e2", "e9", "e10"]
