"""Running the Snakemake workflow from tests: always in a temporary copy, never in the checkout, so that the
tests pass whatever the checkout's own results/ and .snakemake/ hold (e.g. after the README's smoke run)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles", "environment.yml")


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow in `dest` (its own results/ and .snakemake/), running this checkout's src/."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    (dest / "src").symlink_to(REPO / "src")
    return dest


def snakemake_command(*args, env_extra=None) -> tuple[list[str], dict]:
    """argv and a minimal environment (this interpreter's bin first on PATH) of `snakemake ARGS`."""
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(Path.home()), "MPLBACKEND": "Agg",
           "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS": "0", **(env_extra or {})}
    if "GPUNN_TIMING_LOCK" in os.environ:  # the tests' own lock file (conftest.py)
        env["GPUNN_TIMING_LOCK"] = os.environ["GPUNN_TIMING_LOCK"]
    return [str(bin_dir / "snakemake"), *args], env


def run_snakemake(workdir: Path, *args, timeout=600, env_extra=None):
    """`snakemake ARGS` in `workdir` with a minimal environment (this interpreter's bin first on PATH)."""
    argv, env = snakemake_command(*args, env_extra=env_extra)
    return subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)


def doc_pages() -> list[Path]:
    """The README and the manual's pages: docs/**/*.md but the developer notes and the published results."""
    skipped = (REPO / "docs/notes", REPO / "docs/results")
    pages = [page for page in sorted((REPO / "docs").rglob("*.md")) if not any(page.is_relative_to(s) for s in skipped)]
    return [REPO / "README.md", *pages]


def doc_python_blocks(page: str) -> list[str]:
    """The ```python blocks of one page of the manual (a path relative to the repository: "docs/api.md")."""
    return re.findall(r"```python\n(.*?)```", (REPO / page).read_text(), flags=re.DOTALL)


def readme_commands() -> list[str]:
    """The commands the README and the manual's pages (doc_pages) show, each once, in order: the lines of their
    ```bash blocks (comments cut) and the inline `snakemake ...` / `python -m ...` commands of their prose (line
    breaks inside them joined)."""
    found = []
    for page in doc_pages():
        text = page.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
            found += [line.split("  #")[0].strip() for line in block.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL).replace("\n", " ")
        found += [" ".join(c.split()) for c in re.findall(r"`((?:snakemake|python -m) [^`]+)`", prose)]
    return list(dict.fromkeys(c for c in found if c))
