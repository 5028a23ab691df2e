# Stage 4: per-experiment summary tables (CSV + Markdown) and figures under results/report/<experiment>/.
# One rule per experiment (report_e1 .. report_e6), since each has its own inputs and figures.


for _experiment in EXPERIMENTS:

    rule:
        name:
            f"report_{_experiment}"
        input:
            **report_inputs(_experiment),
        output:
            report_files(_experiment),
        log:
            f"results/logs/report/{_experiment}.log",
        params:
            experiment=_experiment,
            args=report_args(report_inputs(_experiment)),
        conda:
            ENV_FILE
        shell:
            "python -m gpunn report {params.experiment} --out results/report/{params.experiment} {params.args} > {log} 2>&1"
