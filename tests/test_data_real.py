"""The real MNIST and Fashion-MNIST through download and prepare, from the shared local copies.

The shared copies (../shared/data/real beside the checkout, see its CHECKSUMS.md files) hold re-gzipped
image files, so they exercise the content-md5 route (only the md5 of the decompressed bytes matches the
published one), and byte-identical label files, which take the archive-md5 route. The registry URLs are
never contacted: the mirror comes first and has every file.
"""

import gzip
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpunn.data import registry
from gpunn.data.download import fetch_dataset
from gpunn.data.integrity import raw_status
from gpunn.data.prepare import load_prepared, prepare_dataset
from gpunn.errors import GpunnError

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
pytestmark = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"the shared real datasets are not here ({REAL} is absent)"
)

IMAGES = ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz")
LABELS = ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
EXPECTED = {
    "mnist": {"test_counts": [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009], "train_mean": 0.130660},
    "fashion_mnist": {"test_counts": [1000] * 10, "train_mean": 0.286041},
}


def quiet(_line):
    pass


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """Both datasets downloaded with the shared folder as mirror and prepared (standard split):
    {name: (raw_dir, log lines, prepared npz)}."""
    root = tmp_path_factory.mktemp("real")
    result = {}
    for name in EXPECTED:
        log = []
        raw = root / "raw" / name
        fetch_dataset(name, raw, mirrors=[REAL], log=log.append)
        out = root / "prepared" / f"{name}.npz"
        prepare_dataset(name, raw, out, log=quiet)
        result[name] = (raw, log, out)
    return result


def ok_line(log, file_name):
    return next(line for line in log if line.split(": ")[1].startswith(f"{file_name} ok"))


@pytest.mark.parametrize("name", EXPECTED)
def test_download_routes(fetched, name):
    raw, log, _ = fetched[name]
    checks = json.loads((raw / "manifest.json").read_text())["checks"]
    spec = registry.get_dataset(name)
    for file_name in IMAGES:
        assert "ok (content md5 matches: re-compressed copy of the published data;" in ok_line(log, file_name)
        assert checks[file_name]["check"] == "content"
        assert checks[file_name]["content_md5"] == spec.content_md5[file_name]
        assert checks[file_name]["md5"] != spec.files[file_name]
    for file_name in LABELS:
        assert "ok (archive md5 matches the published file;" in ok_line(log, file_name)
        assert checks[file_name]["check"] == "archive" and checks[file_name]["md5"] == spec.files[file_name]
    for file_name in spec.files:
        assert checks[file_name]["size"] == (REAL / name / file_name).stat().st_size
    assert not any(line for line in log if "http" in line)  # the registry URLs were never tried
    assert raw_status(name, raw) == {f: "ok" for f in spec.files}


@pytest.mark.parametrize("name", EXPECTED)
def test_prepared_real_data(fetched, name):
    p = load_prepared(fetched[name][2])
    assert p.x_train.shape == (60000, 1, 28, 28) and p.x_test.shape == (10000, 1, 28, 28)
    assert p.y_train.shape == (60000,) and p.y_test.shape == (10000,)
    assert np.bincount(p.y_test, minlength=10).tolist() == EXPECTED[name]["test_counts"]
    assert np.bincount(p.y_train, minlength=10).min() > 5000
    assert p.x_train.mean(dtype=np.float64) / 255 == pytest.approx(EXPECTED[name]["train_mean"], abs=1e-5)
    assert p.class_names == registry.get_dataset(name).class_names


def corrupted_labels(path: Path) -> bytes:
    """The gzip of path's bytes with one label changed: well-formed, only the checksums can tell."""
    with gzip.open(path, "rb") as fh:
        data = bytearray(fh.read())
    data[8 + 123] = (data[8 + 123] + 1) % 10  # after the 8-byte IDX header
    return gzip.compress(bytes(data), mtime=0)


def test_download_rejects_a_corrupted_copy(tmp_path, monkeypatch):
    spec = registry.get_dataset("mnist")
    monkeypatch.setitem(registry.DATASETS, "mnist", registry.DatasetSpec(**{**spec.__dict__, "urls": ()}))
    bad = tmp_path / "bad"
    bad.mkdir()
    for file_name in spec.files:
        os.symlink(REAL / "mnist" / file_name, bad / file_name)
    (bad / "t10k-labels-idx1-ubyte.gz").unlink()
    (bad / "t10k-labels-idx1-ubyte.gz").write_bytes(corrupted_labels(REAL / "mnist" / "t10k-labels-idx1-ubyte.gz"))
    dest = tmp_path / "dest"
    with pytest.raises(GpunnError) as err:
        fetch_dataset("mnist", dest, mirrors=[bad], log=quiet)
    msg = str(err.value)
    assert "\n" not in msg and "t10k-labels-idx1-ubyte.gz" in msg and "checksum mismatch" in msg
    assert f"content md5 {spec.content_md5['t10k-labels-idx1-ubyte.gz']}" in msg
    assert not (dest / "t10k-labels-idx1-ubyte.gz").exists() and not (dest / "manifest.json").exists()
    # the same with the genuine folder after it: the corrupted copy is passed over
    log = []
    fetch_dataset("mnist", dest, mirrors=[bad, REAL], log=log.append)
    assert any(line.startswith("mnist: t10k-labels-idx1-ubyte.gz failed: checksum mismatch") for line in log)
    assert "archive md5 matches" in ok_line(log, "t10k-labels-idx1-ubyte.gz")


def test_prepare_rejects_a_corrupted_copy(fetched, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(fetched["mnist"][0], raw)
    path = raw / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(corrupted_labels(path))
    out = tmp_path / "mnist.npz"
    with pytest.raises(GpunnError) as err:
        prepare_dataset("mnist", raw, out, log=quiet)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "manifest.json recorded" in msg
    assert f"gpunn download mnist --dest {raw}" in msg
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    assert raw_status("mnist", raw)["t10k-labels-idx1-ubyte.gz"] == "changed"


def test_real_mnist_e1_through_the_pipeline_offline(workflow_copy):
    """`data.mirror_dir: ../shared/data/real` runs the real E1 offline: the pipeline downloads (from the
    mirror), verifies, prepares and trains on real MNIST (a 2 000-image subset, one epoch, to stay quick)."""
    import yaml

    from snakemake_helpers import run_snakemake

    config = {"results_dir": "results/real", "threads": 1, "data": {"mirror_dir": str(REAL)},
              "experiments": {"e1": {"dataset": "mnist", "hidden": 32, "batch": 32, "lr": 0.1, "epochs": 1,
                                     "subset": 2000, "variants": ["cpu-numpy"], "reductions": ["mean"]},
                              **{e: {"enabled": False} for e in ("e2", "e3", "e4", "e5", "e6")}}}
    (workflow_copy / "real.yaml").write_text(yaml.safe_dump(config))
    out = run_snakemake(workflow_copy, "e1", "--cores", "1", "--configfile", "real.yaml")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = (workflow_copy / "results/real/logs/download/mnist.log").read_text()
    assert "content md5 matches" in log and "archive md5 matches" in log
    (metrics,) = (workflow_copy / "results/real/runs").glob("*/mnist/standard/mlp/cpu-numpy/*/metrics.json")
    summary = json.loads(metrics.read_text())
    assert summary["n_test"] == 10000 and summary["final_test_accuracy"] > 0.7  # measured 78.2 % (chance: 10 %)
