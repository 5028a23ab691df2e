"""Report figures (non-empty, non-blank PNGs) and summary tables (CSV round trip, Markdown formatting)."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from gpunn.errors import GpunnError
from gpunn.report import (
    batch_timing,
    confusion_matrix_figure,
    e2_heatmaps,
    loss_curves,
    markdown_table,
    reconstruction_grid,
    sample_classifications,
    summary_table,
)
from gpunn.report.tables import format_significant

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert image.std() > 0.01
    assert not list(path.parent.glob(f".{path.name}.*"))  # no temporary left behind


def _epoch_csv(path, with_accuracy=True, epochs=5, offset=0.0):
    e = np.arange(1, epochs + 1)
    frame = pd.DataFrame({
        "epoch": e,
        "train_loss": 1.0 / e + offset,
        "test_loss": 1.1 / e + offset,
        "test_accuracy": 0.8 + 0.03 * e if with_accuracy else np.nan,
        "epoch_time_s": 0.5 + 0.01 * e,
    })
    frame.to_csv(path, index=False)
    return path


def test_loss_curves(tmp_path):
    runs = {"cpu": _epoch_csv(tmp_path / "a.csv"), "gpu": _epoch_csv(tmp_path / "b.csv", offset=0.05)}
    out = loss_curves(runs, tmp_path / "fig" / "loss.png", "MLP on MNIST")
    assert out == tmp_path / "fig" / "loss.png"
    _assert_png(out)
    # autoencoder: empty accuracy column -> loss panel only
    ae = tmp_path / "ae.csv"
    _epoch_csv(ae, with_accuracy=False)
    text = ae.read_text()
    assert ",," in text  # the accuracy column really is empty
    _assert_png(loss_curves({"ae": ae}, tmp_path / "ae.png", "AE"))
    wide = mpimg.imread(tmp_path / "fig" / "loss.png").shape[1]
    assert mpimg.imread(tmp_path / "ae.png").shape[1] < wide


def test_loss_curves_bad_input(tmp_path):
    with pytest.raises(GpunnError, match="missing.csv"):
        loss_curves({"x": tmp_path / "missing.csv"}, tmp_path / "o.png", "t")
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"epoch": [1], "train_loss": [1.0]}).to_csv(bad, index=False)
    with pytest.raises(GpunnError, match="test_loss"):
        loss_curves({"x": bad}, tmp_path / "o.png", "t")
    assert not (tmp_path / "o.png").exists()


def test_confusion_matrix_figure(tmp_path):
    m = np.array([[50, 2, 0], [3, 40, 7], [0, 0, 0]])  # an empty true class must not break the colouring
    _assert_png(confusion_matrix_figure(m, ["cat", "dog", "bird"], tmp_path / "c.png", "confusion"))
    with pytest.raises(GpunnError):
        confusion_matrix_figure(m, ["cat", "dog"], tmp_path / "c2.png", "x")
    with pytest.raises(GpunnError):
        confusion_matrix_figure(np.zeros((2, 3)), ["a", "b"], tmp_path / "c3.png", "x")


@pytest.mark.parametrize("channels,dtype", [(1, np.uint8), (3, np.float32)])
def test_reconstruction_grid(tmp_path, channels, dtype):
    rng = np.random.default_rng(0)
    orig = rng.random((12, channels, 16, 16))
    recon = np.clip(orig + 0.1 * rng.normal(size=orig.shape), -0.05, 1.05)  # overshoot is clipped
    if dtype == np.uint8:
        orig = (orig * 255).astype(np.uint8)
        recon = (np.clip(recon, 0, 1) * 255).astype(np.uint8)
    else:
        orig, recon = orig.astype(dtype), recon.astype(dtype)
    _assert_png(reconstruction_grid(orig, recon, tmp_path / "r.png", "reconstructions"))
    with pytest.raises(GpunnError):
        reconstruction_grid(orig, recon[:5], tmp_path / "r2.png", "x")
    with pytest.raises(GpunnError):
        reconstruction_grid(orig[:, :, :, :, None], recon, tmp_path / "r3.png", "x")


def test_sample_classifications(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.normal(size=(30, 1, 28, 28)).astype(np.float32)  # standardised: stretched for display
    labels = rng.integers(0, 10, size=30)
    preds = labels.copy()
    preds[::4] = (preds[::4] + 1) % 10
    names = [f"c{i}" for i in range(10)]
    _assert_png(sample_classifications(images, labels, preds, names, tmp_path / "s.png", "MNIST samples"))
    _assert_png(sample_classifications(images[:7, 0], labels[:7], preds[:7], None, tmp_path / "s7.png", "few"))
    with pytest.raises(GpunnError):
        sample_classifications(images, labels[:3], preds, names, tmp_path / "s2.png", "x")


def test_e2_heatmaps(tmp_path):
    rows = []
    for variant, factor in (("serial", 100.0), ("naive", 2.0), ("tiled", 1.0)):
        for hidden in (32, 64, 128, 256):
            for batch in (32, 64, 128):
                t = factor * hidden / batch
                rows.append(dict(variant=variant, hidden=hidden, batch=batch, train_time_s=t,
                                 forward_time_s=0.4 * t, backward_time_s=0.6 * t,
                                 test_accuracy=0.9 + hidden / 10000 - batch / 100000))
    table = tmp_path / "e2.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    _assert_png(e2_heatmaps(table, tmp_path / "e2.png"))
    # a missing cell and no accuracies still draw
    frame = pd.DataFrame(rows[1:]).assign(test_accuracy=np.nan)
    frame.to_csv(table, index=False)
    _assert_png(e2_heatmaps(table, tmp_path / "e2b.png"))


def test_batch_timing(tmp_path):
    rows = []
    for variant, base in (("cpu-numpy", 5.0), ("gpu-tiled", 0.2)):
        for batch in (1, 8, 32, 128, 512):
            step = base + 0.01 * batch
            rows.append(dict(variant=variant, batch=batch, forward_ms=0.4 * step, backward_ms=0.6 * step,
                             step_ms=step, samples_per_s=batch / step * 1000))
    table = tmp_path / "e3.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    _assert_png(batch_timing(table, tmp_path / "e3.png"))
    pd.DataFrame(rows).drop(columns="step_ms").to_csv(table, index=False)
    with pytest.raises(GpunnError, match="step_ms"):
        batch_timing(table, tmp_path / "e3b.png")


ROWS = [
    {"variant": "cpu-numpy", "batch": 64, "epoch_time_s": 298.6, "test_accuracy": 0.9793, "speedup": 1.0},
    {"variant": "gpu-naive", "batch": 64, "epoch_time_s": 2.2537, "test_accuracy": 0.93861, "speedup": 132.5},
    {"variant": "gpu-tiled", "batch": 64, "epoch_time_s": 0.012345, "test_accuracy": None, "speedup": 24188.0},
]


def test_summary_table_round_trip_and_markdown(tmp_path):
    frame = summary_table(ROWS, tmp_path / "t" / "e1.csv", tmp_path / "t" / "e1.md", "E1: MLP on MNIST")
    back = pd.read_csv(tmp_path / "t" / "e1.csv")
    pd.testing.assert_frame_equal(back, pd.DataFrame(ROWS), check_dtype=False)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)

    md = (tmp_path / "t" / "e1.md").read_text().splitlines()
    assert md[0] == "## E1: MLP on MNIST"
    table = [line for line in md if line.startswith("|")]
    assert len(table) == 2 + len(ROWS)
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["variant", "batch", "epoch_time_s", "test_accuracy", "speedup"]
    assert len({len(line) for line in table}) == 1  # aligned: every line has the same width
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert cells[0] == ["cpu-numpy", "64", "299", "97.93 %", "1"]
    assert cells[1] == ["gpu-naive", "64", "2.25", "93.86 %", "132.5"]
    assert cells[2] == ["gpu-tiled", "64", "0.0123", "-", "24188"]
    assert table[1].split("|")[2].strip().endswith(":")  # numbers right-aligned
    assert not table[1].split("|")[1].strip().endswith(":")  # text left-aligned


def test_summary_table_columns_and_errors(tmp_path):
    frame = summary_table(ROWS, tmp_path / "a.csv", tmp_path / "a.md", "subset",
                          columns=["test_accuracy", "variant"], formats={"variant": str.upper})
    assert list(frame.columns) == ["test_accuracy", "variant"]
    assert list(pd.read_csv(tmp_path / "a.csv").columns) == ["test_accuracy", "variant"]
    assert "CPU-NUMPY" in (tmp_path / "a.md").read_text()
    with pytest.raises(GpunnError, match="nope"):
        summary_table(ROWS, tmp_path / "b.csv", tmp_path / "b.md", "bad", columns=["nope"])
    with pytest.raises(GpunnError):
        summary_table([], tmp_path / "c.csv", tmp_path / "c.md", "empty")
    assert not (tmp_path / "b.csv").exists() and not (tmp_path / "c.md").exists()


def test_markdown_table_formatting():
    frame = pd.DataFrame({"name": ["a|b", "c"], "hidden": [32.0, np.nan], "fit_time_s": [0.001234, 12345.6],
                          "mse": [0.004512, 2.0]})
    text = markdown_table(frame)
    lines = text.strip().splitlines()
    assert len(lines) == 4
    assert "a\\|b" in lines[2] and " 32 |" in lines[2] and "0.00123" in lines[2] and "0.004512" in lines[2]
    assert "12346" in lines[3] and " - " in lines[3]
    assert format_significant(9.996) == "10.0"
    assert format_significant(0.0) == "0"


def test_rate_columns_are_not_times():
    from gpunn.report.tables import is_time_column

    assert is_time_column("fit_time_s") and is_time_column("step_ms") and is_time_column("epoch_time")
    assert not is_time_column("samples_per_s") and not is_time_column("test_accuracy")
    text = markdown_table(pd.DataFrame({"samples_per_s": [95238.13, 1.23456]}))
    assert "95238" in text and "1.235" in text
