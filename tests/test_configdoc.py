"""The configuration reference (docs/configuration.md, gpunn.configdoc): the committed page is what the generator
makes from the config schema, config/config.yaml and the registries; it names every schema key with its default and
description, every dataset, variant and config file; `gpunn config-doc --check` says in one line when a page is
stale and passes on a fresh one."""

from pathlib import Path

import pytest
import yaml

from gpunn import cli, configdoc
from gpunn.backends.registry import VARIANTS
from gpunn.config import SCHEMA_PATH
from gpunn.data.registry import DATASETS
from gpunn.errors import GpunnError

REPO = Path(__file__).resolve().parents[1]
REGENERATE = "python -m gpunn config-doc"


@pytest.fixture(scope="module")
def page() -> str:
    return configdoc.render()


def _schema_keys(node: dict, path: tuple = ()) -> list[tuple[tuple, dict]]:
    """Every key of the schema, walked here on its own (not by configdoc.walk), sections and values."""
    found = []
    for key, sub in node.get("properties", {}).items():
        found.append((path + (key,), sub))
        found += _schema_keys(sub, path + (key,))
    return found


def test_committed_page_is_the_generated_one(page):
    committed = configdoc.DOC_PATH.read_text(encoding="utf-8") if configdoc.DOC_PATH.is_file() else ""
    if committed != page:
        old, new = committed.splitlines(), page.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        pytest.fail(f"docs/configuration.md is stale (first difference at line {line + 1}); regenerate it: "
                    f"{REGENERATE}", pytrace=False)


def test_every_schema_key_is_in_the_page(page):
    schema = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
    lines = page.splitlines()
    keys = _schema_keys(schema)
    assert len(keys) > 100  # the walk found the nested sections (experiments.e1.batch, cluster.mem_mb.svm, ...)
    for path, node in keys:
        dotted = ".".join(path)
        if "properties" in node:  # a section: a heading of its own
            assert any(line.lstrip("#") == f" {dotted}" and line.startswith("##") for line in lines), dotted
            continue
        rows = [line for line in lines if line.startswith(f"| `{dotted}` |")]
        assert len(rows) == 1, f"{dotted}: {len(rows)} rows"
        row = rows[0]
        assert f"`{configdoc.value_text(node['default'])}`" in row, dotted
        assert " ".join(node["description"].split()).replace("|", "\\|") in row, dotted


def test_page_shows_types_limits_and_registry_names(page):
    rows = {line.split(" | ")[0][3:-1]: line for line in page.splitlines() if line.startswith("| `")}
    assert "| integer | `64` | ≥ 1 |" in rows["experiments.e1.batch"]
    assert "one of `isolated`, `overlap`" in rows["timing"]
    assert "≥ 1 or `auto`" in rows["gpus"]
    assert "`2` (config.yaml: `4`)" in rows["threads"]  # the base config's value where it differs from the default
    assert "`[mean, sum]`" in rows["experiments.e1.reductions"] and "no repeats" in rows["experiments.e1.reductions"]
    e4_variants = rows["experiments.e4.variants"]
    assert "`gpu-optimized`" in e4_variants and "`cpu-serial`" not in e4_variants
    assert "`gpu-im2col`" not in rows["experiments.e4.block_variants"]  # it takes no block size
    for name in [*DATASETS, *VARIANTS]:  # a row each in the Datasets and the Training variants tables
        assert name in rows, name


def test_every_config_file_is_described():
    on_disk = {path.name for path in (REPO / "config").glob("*.yaml")}
    assert set(configdoc.CONFIG_FILES) == on_disk, "describe each config file in gpunn.configdoc.CONFIG_FILES"


def test_a_variant_without_summary_stops_the_generator(monkeypatch):
    monkeypatch.delitem(configdoc.VARIANT_SUMMARIES, "gpu-graph")
    with pytest.raises(GpunnError, match="gpu-graph"):
        configdoc.render()


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_check_fails_in_one_line_on_a_stale_or_missing_page_and_passes_on_a_fresh_one(tmp_path, capsys, page):
    target = tmp_path / "configuration.md"
    assert cli.main(["config-doc", "--check", "--out", str(target)]) == 2
    line = _error_line(capsys)
    assert "configuration.md is missing" in line and f"{REGENERATE} --out" in line

    target.write_text(page.replace("| `experiments.e1.batch` | integer | `64`", "| `experiments.e1.batch` | "
                                   "integer | `32`"), encoding="utf-8")
    assert cli.main(["config-doc", "--check", "--out", str(target)]) == 2
    line = _error_line(capsys)
    assert line.startswith("gpunn: error: ") and str(target) in line and f"{REGENERATE} --out {target}" in line

    assert cli.main(["config-doc", "--out", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == page
    capsys.readouterr()
    assert cli.main(["config-doc", "--check", "--out", str(target)]) == 0
    assert capsys.readouterr().err == ""


def test_check_of_the_repository_page_names_the_plain_command(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration\n", encoding="utf-8")
    monkeypatch.setattr(configdoc, "DOC_PATH", stale)
    with pytest.raises(GpunnError) as raised:
        configdoc.check(stale)
    assert str(raised.value).endswith(f"regenerate it: {REGENERATE}")
