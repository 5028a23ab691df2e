# Stage 4: per-experiment summary tables (CSV + Markdown) and figures (PNG + PDF) under
# <results_dir>/report/<machine>/<eN>/, one rule per experiment (report_e1 .. report_e6), since each has its own
# inputs and figures; then the entry page over them, <results_dir>/report/<machine>/index.md (report_index).


for _experiment in EXPERIMENTS:

    rule:
        name:
            f"report_{_experiment}"
        localrule: True  # tables and figures of small CSVs: seconds, not worth a cluster job
        message:
            job_message(f"report_{_experiment}: tables, figures, the paper beside ours")
        input:
            **report_inputs(config, _experiment),
            jobs=job_benchmarks(config, _experiment),
        output:
            report_files(_experiment),
        log:
            job_log("report", f"{M}/{_experiment}"),
        benchmark:
            job_benchmark("report", f"{M}/{_experiment}")
        params:
            experiment=_experiment,
            out=folder_of("output"),
            args=report_args({**report_inputs(config, _experiment), "jobs": job_benchmarks(config, _experiment)}),
        conda:
            ENV_FILE
        shell:
            logged("python -m gpunn report {params.experiment} --out {params.out} {params.args}")


rule report_index:
    """The entry page over every enabled experiment's report (gpunn.report.index): index.md with the papers'
    headline numbers beside ours and links to every table and figure, index.csv (its summary table) and
    index.rst (the front page of `snakemake --report`)."""
    message:
        job_message("report_index: the entry page, index.md")
    localrule: True
    input:
        [f for e in enabled_experiments(config) for f in report_outputs(config, e)],
    output:
        index_outputs(config),
    log:
        job_log("report", f"{M}/index"),
    benchmark:
        job_benchmark("report", f"{M}/index")
    params:
        out=folder_of("output"),
        args=" ".join(shlex.quote(a) for a in index_args(config)),
    conda:
        ENV_FILE
    shell:
        logged("python -m gpunn index --out {params.out} {params.args}")
