# Stage 2b: where a training step's time goes (E1, E4, E5): each launch of one step of a GPU variant, timed alone
# (gpunn.timing.step_profile), at the experiment's widths, batch and sample shape; under the CUDA simulator the
# launch list without times. A timed GPU job like train: a GPU of its own (resources gpu, timing; gpunn.placement).


rule step_profile:
    """One GPU variant's step profile for an experiment's report (gpunn profile): a CSV row per launch."""
    message:
        job_message("step_profile: {wildcards.experiment}, one training step of {wildcards.variant}")
    output:
        f"{R}/profile/{M}/{{experiment}}/{{variant}}.csv",
    log:
        job_log("step_profile", f"{M}/{{experiment}}/{{variant}}"),
    benchmark:
        job_benchmark("step_profile", f"{M}/{{experiment}}/{{variant}}")
    wildcard_constraints:
        experiment="|".join(PROFILED),
    params:
        options=profile_args,
        env=job_prefix(timed=True, gpu=1),
    threads: 1
    resources:
        **rule_resources("step_profile", timed=True, gpu=gpu_job),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn profile {params.options} --variants {wildcards.variant} --out {output}",
            fingerprints=True,
        )
