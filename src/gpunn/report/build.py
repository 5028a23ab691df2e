"""One experiment's report: its tables (CSV + Markdown) and figures (PNG + PDF), written by the experiment's
module (gpunn.experiments.eN), then the wall times of the jobs it depends on (jobs.csv/.md) and last its
provenance.json: the devices, drivers, package versions and commits of its inputs (gpunn.report.sources)."""

from __future__ import annotations

from pathlib import Path

from gpunn import experiments
from gpunn.report import job_times, sources
from gpunn.report.runs import trust_overlap


def make_report(experiment: str, out_dir, runs=(), evals=(), timings=(), svm=(), blocks=(), profiles=(), jobs=(),
                verdict=(), **options) -> dict[str, str]:
    """Write one experiment's tables and figures into `out_dir`, and the wall times of its jobs (`jobs`: their
    benchmark files) as jobs.csv/.md; returns each one's title by file name (the Markdown tables under their .md
    name). `verdict`: gpunn overlap-verdict's verdict.json for runs timed under overlap (runs.trust_overlap)."""
    for path in verdict:
        trust_overlap(path)
    report = experiments.get(experiment).report
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = report(runs=list(runs), evals=list(evals), timings=list(timings), svm=list(svm), blocks=list(blocks),
                     profiles=list(profiles), out_dir=out_dir, **options)
    if jobs:
        written.update(job_times.write(out_dir, experiment, jobs))
    # last, so that a report whose tables or figures failed has no provenance.json either (the index needs it)
    sources.write(out_dir / sources.PROVENANCE, experiment,
                  sources.collect(runs=runs, svm=svm, timings=timings, blocks=blocks, profiles=profiles))
    return written
