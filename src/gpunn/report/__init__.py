"""Report: figures (PNG, matplotlib Agg) and summary tables (CSV + Markdown) for the experiments."""

from gpunn.report.figures import (
    batch_timing,
    confusion_matrix_figure,
    e2_heatmaps,
    loss_curves,
    reconstruction_grid,
    sample_classifications,
)
from gpunn.report.tables import markdown_table, summary_table

__all__ = [
    "batch_timing",
    "confusion_matrix_figure",
    "e2_heatmaps",
    "loss_curves",
    "markdown_table",
    "reconstruction_grid",
    "sample_classifications",
    "summary_table",
]
