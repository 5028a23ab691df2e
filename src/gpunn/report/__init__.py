"""Report: figures (PNG, matplotlib Agg) and summary tables (CSV + Markdown) for the experiments.

    experiments  the report of each experiment E1..E6 from its finished runs (make_report; `gpunn report`)
    tables       summary tables: CSV and Markdown, number formats, variant order
    figures      the figures: loss curves, heatmaps, timings, samples, reconstructions, confusion matrix
    titles       titles built from the rows shown: sizes, device, simulator warning

The package face imports nothing: planning the workflow reads captions and targets without loading matplotlib.
"""
