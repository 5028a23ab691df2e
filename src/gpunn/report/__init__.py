"""Report helpers shared by every experiment (gpunn.experiments holds each experiment's own tables and figures).

    build         one experiment's report: its module's tables and figures, then jobs.csv/.md and provenance.json
    runs          one tidy row per finished run, speedups and accuracy differences against baseline runs
    tables        summary tables: CSV and Markdown, number formats, variant order
    figures       generic figures (loss curves, epoch lines, samples, reconstructions, confusion matrix); matplotlib
                  is imported at the first figure drawn
    titles        titles built from the rows shown: sizes, device, simulator warning
    papers        PaperValue, one number of a paper as printed, and select
    paper_vs_ours the paper's numbers beside ours (Ours, compare, paper_vs_ours.csv/.md)
    index         the entry page over the experiments' reports; readme: the README's Results section from it
    captions, divergence, job_times, sources, step_profile   a figure's caption, diverged runs, the jobs' wall
                  times, provenance.json, where a training step's time goes

The package face imports nothing: planning the workflow loads no matplotlib.
"""
