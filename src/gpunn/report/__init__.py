"""Report: figures (PNG, matplotlib Agg) and summary tables (CSV + Markdown) for the experiments.

    experiments  the report of each experiment E1..E6 from its finished runs (make_report; `gpunn report`)
    tables       summary tables: CSV and Markdown, number formats, variant order
    figures      the figures: loss curves, heatmaps, timings, samples, reconstructions, confusion matrix
    titles       titles built from the rows shown: sizes, device, simulator warning
"""

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
