# Stage 4: per-experiment summary tables (CSV + Markdown) and figures under <results_dir>/report/<machine>/<eN>/.
# One rule per experiment (report_e1 .. report_e6), since each has its own inputs and figures.


for _experiment in EXPERIMENTS:

    rule:
        name:
            f"report_{_experiment}"
        input:
            **report_inputs(config, _experiment),
        output:
            report_files(_experiment),
        log:
            f"{R}/logs/report/{M}/{_experiment}.log",
        params:
            experiment=_experiment,
            out=folder_of("output"),
            args=report_args(report_inputs(config, _experiment)),
        conda:
            ENV_FILE
        shell:
            "python -m gpunn report {params.experiment} --out {params.out} {params.args} 2>&1 | tee {log}"
