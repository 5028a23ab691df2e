"""Every command the README and the manual's pages (docs/*.md) show, checked: Snakemake commands as dry runs in a
copy of the workflow (the smoke run's `--report` form runs for real in test_smoke_pipeline.py), `python -m gpunn.bench`
commands through the bench's own argument parser (they need a GPU to run), the install and test commands against
CI's, the Python examples of docs/api.md run (test_api.py runs the GPU one under the simulator). A new command in
any of those pages fails test_every_command_is_checked until one of these checks covers it. Links and the pages'
reach: test_docs.py."""

from __future__ import annotations

import math
import shlex

import pytest

from snakemake_helpers import REPO, doc_python_blocks, readme_commands, run_snakemake

COMMANDS = readme_commands()
SNAKEMAKE = [c for c in COMMANDS if c.startswith("snakemake ") and "--report" not in c]
BENCH = [c for c in COMMANDS if c.startswith("python -m gpunn.bench ")]
GPUNN = [c for c in COMMANDS if c.startswith("python -m gpunn ")]
WARM = [c for c in COMMANDS if c.startswith("python -m gpunn.warm ")]
# Tools named in the prose, not commands to run as written
MENTIONS = {"python -m gpunn.bench", "snakemake --report", "python -m gpunn.placement ... -- <command>"}
SETUP = {"python3 -m venv .venv && source .venv/bin/activate", 'pip install -e ".[test,slurm]"',
         'pip install -e ".[slurm]"', "python -m pytest -n 2 --dist loadfile", "python -m pytest -m gpu",
         "python -m pytest"}


def test_every_command_is_checked():
    reports = [c for c in COMMANDS if c.startswith("snakemake ") and "--report" in c]
    checked = SNAKEMAKE + BENCH + GPUNN + WARM + reports
    unchecked = [c for c in COMMANDS if c not in checked and c not in SETUP | MENTIONS]
    assert not unchecked, f"README / docs commands no test checks: {unchecked}"
    assert len(SNAKEMAKE) >= 12 and len(BENCH) >= 8 and reports  # the parser still finds them


@pytest.mark.parametrize("command", WARM)
def test_warm_server_commands_run(command, tmp_path):
    """The warm servers' commands (gpunn.warm) run as written, on a private socket folder."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *shlex.split(command)[1:]], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0 and done.stdout.startswith("gpunn.warm: stopped 0 server(s)"), done.stderr


def test_install_and_test_commands_are_cis():
    """CI (.ci/run) installs and tests with the README's commands."""
    ci = (REPO / ".ci/run").read_text()
    for command in ('pip install -e ".[test,slurm]"', "python -m pytest -n 2 --dist loadfile"):
        assert command in COMMANDS and command in ci.replace("python -m pip ", "pip ")


@pytest.mark.parametrize("command", SNAKEMAKE)
def test_snakemake_commands_plan_as_written(workflow_copy, command):
    """Each Snakemake command, as a dry run in a copy of the workflow: it plans without an error, and where it
    names the smoke config after its targets (or with `=`), the plan is the smoke run's."""
    args = shlex.split(command)[1:]
    out = run_snakemake(workflow_copy, *args, *([] if "--unlock" in args else ["-n"]))
    assert out.returncode == 0, (command, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and "config error" not in out.stderr, (command, out.stderr[-2000:])
    if "config/smoke.yaml" in command and "--list-target-rules" not in args and "--unlock" not in args:
        assert "\nJob " in out.stdout and "train: digits8_mini/standard/mlp/cpu-numpy/" in out.stdout, command  # E1's


@pytest.mark.parametrize("command", BENCH)
def test_bench_commands_parse(command):
    """`python -m gpunn.bench ...` needs a real GPU; its arguments are checked by the bench's own parser."""
    from gpunn.bench.__main__ import build_parser

    args = shlex.split(command)[3:]
    parsed = build_parser().parse_args(args)
    assert parsed.op == args[0]


@pytest.mark.parametrize("command", GPUNN)
def test_gpunn_commands_parse(command):
    """`python -m gpunn ...` (the pipeline's steps): the arguments are the command line's own."""
    from gpunn.cli import build_parser

    args = shlex.split(command)[3:]
    if args == ["--help"]:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args(args)
        assert done.value.code == 0
    else:
        assert build_parser().parse_args(args).command == args[0]


def test_the_layers_example_runs():
    """The API page's first Python example (layers, loss and optimiser by hand) runs on the CPU; given 40 steps
    instead of 10 on its one random batch, its loss falls below a uniform guess's."""
    (code,) = [block for block in doc_python_blocks("docs/api.md") if "SoftmaxCrossEntropy" in block]
    assert "range(10)" in code
    scope = {}
    exec(compile(code.replace("range(10)", "range(40)"), "docs/api.md", "exec"), scope)
    assert math.isfinite(scope["loss"]) and scope["loss"] < math.log(10)
    assert scope["model"].flat.size == 784 * 256 + 256 + 256 * 10 + 10


def test_the_results_section_is_the_published_entry_pages():
    """The README's generated Results section (gpunn publish --readme) is what the published entry page it names
    gives today, so that the README never disagrees with the index it came from, and every experiment ran there."""
    from gpunn.report import readme

    text, folder = readme.current(REPO / "README.md")
    assert (REPO / folder / "index.md").is_file(), folder
    assert text == readme.section(REPO / folder, REPO)
    for experiment in ("E1", "E2", "E3", "E4", "E5", "E6"):
        assert f"\n| {experiment} | " in text and f"\n- {experiment}: " in text and "not run" not in text
    assert "| Whole run | " in text and "synthetic_cifar10" in text
