"""Early validation of the pipeline config (gpunn.config): text read as numbers where the schema wants them,
one-line errors naming the key, names checked against the dataset and variant registries, the CPU-only
switch, the machine name that keeps measured outputs apart (the README's commands: test_readme.py)."""

from __future__ import annotations

import pytest
import yaml

from gpunn.backends.registry import uses_gpu
from gpunn.config import load_config, machine_slug
from gpunn.errors import GpunnError
from gpunn.targets import Layout, report_inputs, report_outputs

from snakemake_helpers import REPO, run_snakemake


def no_gpu():
    return None


def load(raw, **kwargs):
    kwargs.setdefault("gpu_name", no_gpu)
    kwargs.setdefault("log", lambda line: None)
    return load_config(raw, **kwargs)


def test_defaults_fill_an_empty_config():
    config = load({})
    assert config["results_dir"] == "results" and config["machine"] == "cpu"
    e6 = config["experiments"]["e6"]
    assert e6["train_subset"] == "auto" and e6["kernel_device"] == "auto"
    assert config["experiments"]["e1"]["batch"] == 64 and config["gpu"] == {"enabled": True, "simulator": False}
    e3 = config["experiments"]["e3"]
    assert (e3["steps"], e3["samples"], e3["timed_epochs"], e3["repeats"]) == (938, 60000, 3, 20)
    assert e3["variants"][-1] == "gpu-graph"


@pytest.mark.parametrize("raw, key, value", [
    ({"data": {"timeout_s": "2"}}, ("data", "timeout_s"), 2.0),                  # --config data='{timeout_s: 2}'
    ({"experiments": {"e1": {"lr": "1e-3"}}}, ("experiments", "e1", "lr"), 1e-3),  # YAML 1.1 reads 1e-3 as text
    ({"experiments": {"e1": {"batch": "32"}}}, ("experiments", "e1", "batch"), 32),
    ({"experiments": {"e2": {"hidden": ["16", "32"]}}}, ("experiments", "e2", "hidden"), [16, 32]),
    ({"gpu": {"simulator": "true"},
      "experiments": {e: {"variants": ["cpu-numpy"]} for e in ("e1", "e3", "e4", "e5")}}, ("gpu", "simulator"), True),
    ({"experiments": {"e3": {"steps": "50"}}}, ("experiments", "e3", "steps"), 50),
    ({"experiments": {"e5": {"variant_epochs": {"gpu-naive": "2"}}}}, ("experiments", "e5", "variant_epochs"),
     {"gpu-naive": 2}),  # --config experiments='{e5: {variant_epochs: {gpu-naive: 2}}}'
    ({"experiments": {"e6": {"gamma": "0.5"}}}, ("experiments", "e6", "gamma"), 0.5),
    ({"experiments": {"e6": {"gamma": "auto"}}}, ("experiments", "e6", "gamma"), "auto"),
    ({"experiments": {"e6": {"train_subset": "5000"}}}, ("experiments", "e6", "train_subset"), 5000),
    ({"experiments": {"e6": {"train_subset": "auto"}}}, ("experiments", "e6", "train_subset"), "auto"),
])
def test_numbers_and_booleans_given_as_text_are_read(raw, key, value):
    config = load(raw)
    for part in key:
        config = config[part]
    assert config == value and type(config) is type(value)


def test_yaml_file_with_1e_minus_3(tmp_path):
    raw = yaml.safe_load("experiments:\n  e5: {lr: 1e-3}\n")
    assert raw["experiments"]["e5"]["lr"] == "1e-3"  # what YAML 1.1 gives
    assert load(raw)["experiments"]["e5"]["lr"] == 0.001


@pytest.mark.parametrize("raw, message", [
    ({"experiments": {"e1": {"dataset": "mnistt"}}},
     "config key experiments.e1.dataset = 'mnistt' is not a known dataset; choose one of mnist, fashion_mnist"),
    ({"experiments": {"e4": {"datasets": ["mnist", "fashion"]}}},
     "config key experiments.e4.datasets[1] = 'fashion' is not a known dataset"),
    ({"experiments": {"e1": {"variants": ["CPU_NumPy"]}}},
     "config key experiments.e1.variants = 'CPU_NumPy' is not a known variant; choose one of cpu-numpy, cpu-serial"),
    ({"experiments": {"e2": {"variants": ["gpu-turbo"]}}},
     "experiments.e2.variants = 'gpu-turbo' is not a known variant"),
    ({"experiments": {"e4": {"variants": ["cpu-serial"]}}},
     "config key experiments.e4.variants = 'cpu-serial' does not train the cnn; choose one of cpu-numpy"),
    ({"experiments": {"e4": {"block_variants": ["gpu-im2col"]}}},
     "config key experiments.e4.block_variants = 'gpu-im2col' takes no block size; "
     "choose one of gpu-naive, gpu-optimized"),
    ({"experiments": {"e4": {"block_sizes": [128, 128]}}}, "experiments.e4.block_sizes lists a size twice"),
    ({"experiments": {"e4": {"block_sizes": [2048]}}}, "config key experiments.e4.block_sizes.0: 2048 is not one of"),
    ({"experiments": {"e4": {"block_sizes": []}}}, "experiments.e4.block_sizes is empty while"),
    ({"experiments": {"e4": {"block_dataset": "cifar"}}},
     "experiments.e4.block_dataset = 'cifar' is not a known dataset"),
    ({"experiments": {"e6": {"gamma": "banana"}}},
     "config key experiments.e6.gamma = 'banana'; choose one of scale, auto, a positive number"),
    ({"experiments": {"e6": {"method": "approx"}}},
     "config key experiments.e6.method = 'approx'; choose one of auto, exact, nystroem, gpu-smo"),
    ({"experiments": {"e6": {"method": ["exact", "svm"]}}}, "config key experiments.e6.method[1] = 'svm'; choose"),
    ({"experiments": {"e6": {"method": []}}}, "config key experiments.e6.method: [] should be non-empty"),
    ({"experiments": {"e6": {"train_subset": "most"}}},
     "config key experiments.e6.train_subset = 'most'; choose one of auto, 0 (all rows), a row count"),
    ({"experiments": {"e6": {"train_subset": -1}}},
     "config key experiments.e6.train_subset: -1 is less than the minimum of 0"),
    ({"experiments": {"e6": {"kernel_device": "tpu"}}}, "config key experiments.e6.kernel_device: 'tpu' is not one of"),
    ({"experiments": {"e6": {"variant": "gpu-fused"}}},
     "config key experiments.e6.variant = 'gpu-fused' is not one of experiments.e5.variants; choose one of cpu-numpy"),
    ({"experiments": {"e5": {"variant_epochs": {"gpu-fused": 2}}}},
     "config key experiments.e5.variant_epochs = 'gpu-fused' is not one of experiments.e5.variants; choose one of "
     "cpu-numpy, gpu-naive, gpu-tiled, gpu-im2col, gpu-graph"),
    ({"experiments": {"e5": {"variant_epochs": {"gpu-naive": 0}}}},
     "config key experiments.e5.variant_epochs.gpu-naive: 0 is less than the minimum of 1"),
    ({"experiments": {"e1": {"batch": 0}}}, "config key experiments.e1.batch: 0 is less than the minimum of 1"),
    ({"experiments": {"e1": {"reductions": ["mean", "avg"]}}},
     "config key experiments.e1.reductions.1: 'avg' is not one of ['mean', 'sum']"),
    ({"experiments": {"e1": {"reductions": ["sum", "sum"]}}},
     "config key experiments.e1.reductions: ['sum', 'sum'] has non-unique elements"),
    ({"data": {"timeout_s": "soon"}}, "config key data.timeout_s: 'soon' is not of type 'number'"),
    ({"gpu": {"simulator": True}}, "experiments.e1.variants = 'gpu-graph' cannot run under the CUDA simulator"),
    ({"gpu": {"simulator": True}, "experiments": {e: {"variants": ["cpu-numpy"]} for e in ("e1", "e4", "e5")}},
     "experiments.e3.variants = 'gpu-graph' cannot run under the CUDA simulator"),  # E3 times gpu-graph by default
    ({"experiments": {"e3": {"steps": 0}}}, "config key experiments.e3.steps: 0 is less than the minimum of 1"),
    ({"experiments": {"e3": {"timed_epochs": 0}}}, "config key experiments.e3.timed_epochs: 0 is less than the"),
    ({"turbo": 1}, "config key turbo is unknown; known keys here: results_dir, machine, threads"),
    ({"experiments": {"e1": {"epoch": 3}}}, "config key experiments.e1.epoch is unknown; known keys here: enabled"),
    ({"machine": "My GPU"}, "config key machine: 'My GPU' does not match"),
    ({"gpu": {"enabled": False}, "experiments": {"e1": {"variants": ["gpu-fused"]}}},
     "config key experiments.e1.variants is empty once gpu.enabled: false drops the GPU variants"),
])
def test_bad_values_are_one_line_naming_the_key(raw, message):
    with pytest.raises(GpunnError) as error:
        load(raw)
    text = str(error.value)
    assert message in text and "\n" not in text


def test_e6_auto_encodes_with_the_fastest_gpu_variant_of_e5():
    assert load({})["experiments"]["e6"]["variant"] == "gpu-graph"
    assert load({"experiments": {"e5": {"variants": ["cpu-numpy", "gpu-naive", "gpu-im2col"]}}}
                )["experiments"]["e6"]["variant"] == "gpu-im2col"
    cpu = load({"gpu": {"enabled": False}, "experiments": {"e5": {"variant_epochs": {"gpu-naive": 2}}}},
               log=lambda line: None)
    assert cpu["experiments"]["e6"]["variant"] == "cpu-numpy" and cpu["experiments"]["e5"]["variant_epochs"] == {}


def test_cpu_only_switch_drops_every_gpu_job():
    lines = []
    config = load({"gpu": {"enabled": False}}, log=lines.append)
    for exp in ("e1", "e2", "e3", "e4", "e5"):
        assert not any(uses_gpu(v) for v in config["experiments"][exp]["variants"])
    assert config["experiments"]["e1"]["variants"] == ["cpu-numpy", "cpu-serial"]
    assert "blocks" not in report_inputs(config, "e3")
    assert not any("block" in p for p in report_outputs(config, "e3"))
    assert config["experiments"]["e4"]["block_variants"] == []  # E4's block-size study: none, nor its report files
    assert not any("block" in p for p in report_outputs(config, "e4") + report_inputs(config, "e4")["runs"])
    assert lines and "gpu-graph" in lines[0] and "block sweep" in lines[0] and "E6" not in lines[0]
    assert config["experiments"]["e6"]["kernel_device"] == "cpu"  # auto would find a GPU where there is one
    lines = []
    asked = load({"gpu": {"enabled": False}, "experiments": {"e6": {"kernel_device": "gpu"}}}, log=lines.append)
    assert asked["experiments"]["e6"]["kernel_device"] == "cpu" and "E6's SVM kernel is computed on the CPU" in lines[0]
    assert load({"gpu": {"enabled": False}}, gpu_name=lambda: "NVIDIA H100")["machine"] == "cpu"
    shipped = yaml.safe_load((REPO / "config/cpu.yaml").read_text())
    assert load(shipped)["gpu"]["enabled"] is False


def test_e6_method_auto_follows_the_machine_and_a_list_runs_each_once():
    """auto is gpu-smo on a GPU machine and exact on the CPU or the simulator; a list keeps its order, each method
    once; gpu.enabled false turns gpu-smo into exact; each method's svm metrics are among E6's report inputs."""
    h200 = {"gpu_name": lambda: "NVIDIA H200"}
    assert load({}, **h200)["experiments"]["e6"]["method"] == ["gpu-smo"]
    assert load({})["experiments"]["e6"]["method"] == ["exact"]
    smoke = yaml.safe_load((REPO / "config/smoke.yaml").read_text())  # the simulator
    smoke["experiments"]["e6"]["method"] = "auto"
    assert load(smoke, **h200)["experiments"]["e6"]["method"] == ["exact"]
    both = load({"experiments": {"e6": {"method": ["auto", "exact", "gpu-smo"]}}}, **h200)
    assert both["experiments"]["e6"]["method"] == ["gpu-smo", "exact"]
    svm = report_inputs(both, "e6")["svm"]
    assert [p.split("/")[3] for p in svm] == ["gpu-smo", "exact"] and svm[0].startswith("results/svm/nvidia-h200/")
    lines = []
    off = load({"gpu": {"enabled": False}, "experiments": {"e6": {"method": ["gpu-smo", "nystroem"]}}},
               log=lines.append, **h200)
    assert off["experiments"]["e6"]["method"] == ["exact", "nystroem"] and "gpu-smo solves on the GPU" in lines[0]


def test_e5_report_files():
    """E5's report: the summary, the paper's section 2.4 and 3.1 tables, the paper's numbers beside ours, its MSE,
    reconstruction and section 3.2 figures, its GPU variants' step profile (table and figure) and its jobs' times."""
    outputs = report_outputs(load({}), "e5")
    assert [p.rsplit("/", 1)[1] for p in outputs] == [
        "summary.csv", "summary.md", "paper_table.csv", "paper_table.md", "paper_vs_ours.csv", "paper_vs_ours.md",
        "step_profile.csv", "step_profile.md", "jobs.csv", "jobs.md", "mse_curves.png", "reconstructions.png",
        "training_time.png", "speedup.png", "step_profile.png", "mse_curves.pdf", "reconstructions.pdf",
        "training_time.pdf", "speedup.pdf",
        "step_profile.pdf", "provenance.json"]


def test_e4_report_files_follow_the_block_study():
    """The smoke config's E4 has a block study (gpu-naive at 32 and 64 threads): its runs are the report's inputs
    and its table and figures are among the report's outputs."""
    smoke = load(yaml.safe_load((REPO / "config/smoke.yaml").read_text()))
    outputs = report_outputs(smoke, "e4")
    assert all(p.startswith("results/smoke/report/cudasim/e4/") for p in outputs)
    assert [p.rsplit("/", 1)[1] for p in outputs] == [
        "summary.csv", "summary.md", "paper_table.csv", "paper_table.md", "blocks.csv", "blocks.md",
        "paper_vs_ours.csv", "paper_vs_ours.md", "step_profile.csv", "step_profile.md", "jobs.csv", "jobs.md",
        "cumulative_time.png",
        "loss_curves.png", "samples_digits8_mini.png", "block_time.png", "block_loss.png", "step_profile.png",
        "cumulative_time.pdf", "loss_curves.pdf", "samples_digits8_mini.pdf", "block_time.pdf", "block_loss.pdf",
        "step_profile.pdf", "provenance.json"]
    block_runs = [p for p in report_inputs(smoke, "e4")["runs"] if "_t" in p.rsplit("/", 2)[1]]
    assert [p.split("/")[-2].rsplit("_", 1)[1] for p in block_runs] == ["t32"]
    assert all("/gpu-naive/" in p for p in block_runs)
    # a block study on a dataset the main runs do not use: its runs are inputs, but it has no sample figure
    apart = load({"experiments": {"e4": {"datasets": ["fashion_mnist"], "block_dataset": "mnist"}}})
    assert [p.rsplit("/", 1)[1] for p in report_outputs(apart, "e4") if "samples" in p] == [
        "samples_fashion_mnist.png", "samples_fashion_mnist.pdf"]
    assert [p.split("/")[3] for p in report_inputs(apart, "e4")["evals"]] == ["fashion_mnist"]
    assert any(p.split("/")[3] == "mnist" for p in report_inputs(apart, "e4")["runs"])


def test_machine_keeps_devices_and_the_simulator_apart():
    assert load({}, gpu_name=lambda: "NVIDIA H100 80GB HBM3")["machine"] == "nvidia-h100-80gb-hbm3"
    simulated = load({"gpu": {"simulator": True}, "experiments": {"e1": {"variants": ["cpu-numpy", "gpu-fused"]},
                                                                  "e3": {"variants": ["cpu-numpy", "gpu-fused"]},
                                                                  "e4": {"variants": ["cpu-numpy", "gpu-im2col"]},
                                                                  "e5": {"variants": ["cpu-numpy", "gpu-im2col"]}}})
    assert simulated["machine"] == "cudasim"
    assert load({"machine": "lab-box-2"}, gpu_name=lambda: "NVIDIA H200")["machine"] == "lab-box-2"
    assert machine_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    layout = Layout.of(load({"results_dir": "out/x"}, gpu_name=lambda: "NVIDIA H200"))
    assert layout.measured("runs") == "out/x/runs/nvidia-h200" and layout.raw_dir("mnist") == "out/x/data/raw/mnist"


def test_no_gpu_note_points_to_the_cpu_route():
    from gpunn.config import missing_gpu_note

    lines = []
    config = load({}, log=lines.append)
    assert lines == []  # loading says nothing: the first planned GPU job prints the note (the workflow)
    assert "config/cpu.yaml" in missing_gpu_note({}, config)
    assert missing_gpu_note({"machine": "cpu"}, config) is None  # set by hand: the user knows


def test_gpu_note_only_when_a_planned_job_needs_a_gpu(workflow_copy):
    """Once for a plan with GPU jobs; never for --list-target-rules, --unlock or a CPU-only target."""
    from gpunn.config import detect_gpu_name

    if detect_gpu_name():
        pytest.skip("a GPU is present: no note to print")
    note = "no GPU found here"
    assert run_snakemake(workflow_copy, "e1", "-n").stderr.count(note) == 1
    for args in (["--list-target-rules"], ["--unlock"],
                 ["e1", "-n", "--config", "experiments={e1: {variants: [cpu-numpy]}}"]):
        out = run_snakemake(workflow_copy, *args)
        assert out.returncode == 0 and note not in out.stdout + out.stderr, args
    assert "is extended by additional config" not in run_snakemake(workflow_copy, "e1", "-n", "--configfile",
                                                                   "config/smoke.yaml").stdout


def test_cpu_lanes_need_timing_overlap():
    assert load({"timing": "overlap", "cpu_lanes": 2})["cpu_lanes"] == 2
    assert load({})["cpu_lanes"] == 1
    with pytest.raises(GpunnError, match="config key cpu_lanes: 2 lanes need timing: overlap \\(under isolated one "
                                         "timed job runs at a time\\); set timing: overlap or cpu_lanes: 1"):
        load({"cpu_lanes": 2})


def test_a_config_file_with_a_tab_or_bad_yaml_is_one_line_with_its_file_and_line(tmp_path):
    """gpunn's own config reading (gpunn publish --configfile, the workflow's base config): where yaml's error is ten
    lines and Snakemake's names neither file nor line, one line with both and what to do."""
    from gpunn.config import read_config_file
    from gpunn.publish import load_files

    tab = tmp_path / "tab.yaml"
    tab.write_text("seed: 0\nexperiments:\n  e1:\n\tenabled: false\n")
    bracket = tmp_path / "bracket.yaml"
    bracket.write_text("timing: overlap\ngpus: [0, 1\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    cases = [
        (tab, rf"^{tab} line 4, column 1: not valid YAML \(found character '\\t' that cannot start any token\); YAML "
              r"indents with spaces only: replace the tab\(s\) on that line with spaces$"),
        (bracket, rf"^{bracket} line 3, column 1: not valid YAML \(expected ',' or '\]', but got '<stream end>'\); fix "
                  r"the YAML there"),
        (listed, rf"^{listed}: a config file must be a mapping of keys to values, got a list$"),
        ("e9", r"^no such config file 'e9': check the path$"),
    ]
    for path, message in cases:
        for read in (read_config_file, lambda p: load_files([p])):
            with pytest.raises(GpunnError, match=message):
                read(path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert read_config_file(empty) == {}


def test_a_tab_in_the_base_config_stops_the_workflow_with_one_line(tmp_path):
    """config/config.yaml is read by the workflow itself (common.smk), so its bad YAML gets gpunn's line; a file given
    with --configfile is read by Snakemake before the Snakefile runs (docs/notes/issue-41/surprises.md)."""
    from snakemake_helpers import copy_workflow

    workdir = copy_workflow(tmp_path / "wf")
    base = workdir / "config" / "config.yaml"
    lines = base.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("  ") and ":" in line)
    lines[at] = "\t" + lines[at].lstrip(" ")
    base.write_text("".join(lines))
    out = run_snakemake(workdir, "-n", "e1")
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "config" in line and "profile" not in line]
    assert errors == [f"gpunn: config error: {base} line {at + 1}, column 1: not valid YAML (found character '\\t' "
                      "that cannot start any token); YAML indents with spaces only: replace the tab(s) on that line "
                      "with spaces"], out.stderr
    assert "Traceback" not in out.stderr
