# Stage 2: training and evaluation. One rule serves every dataset, model, variant and hyperparameter set:
# GPU variants and sweeps are new wildcard values. Training is timed: timed jobs never share cores or a GPU
# (config key timing: resources `timing` and `gpu`, gpunn.placement binding each job, gpunn's timing locks keeping
# timed jobs of other pipelines out too). Measured outputs go under <results_dir>/<stage>/<machine>/.


rule train:
    """Train one run; metrics.csv has one row per epoch, metrics.json the summary and provenance. A diverged run
    fails the job and writes nothing, unless an experiment requesting it sets keep_diverged (params.keep)."""
    message:
        job_message(f"train: {RUN_NAME}")
    input:
        f"{R}/data/prepared/{{dataset}}/{{split}}.npz",
    output:
        metrics=f"{R}/runs/{M}/{RUN}/metrics.json",
        curve=f"{R}/runs/{M}/{RUN}/metrics.csv",
        weights=f"{R}/runs/{M}/{RUN}/weights.npz",
    log:
        job_log("train", f"{M}/{RUN}"),
    benchmark:
        job_benchmark("train", f"{M}/{RUN}")
    params:
        run=format_run_path,
        out=folder_of("output"),
        env=job_prefix(timed=True, gpu=uses_gpu),
        keep=keep_diverged_option,
    threads: cpu_threads
    resources:
        **rule_resources("train", timed=True, gpu=uses_gpu),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn train {params.run} --data {input} --out {params.out} {params.keep}",
            fingerprints=True,
        )


rule evaluate:
    """Test-set metrics, per-class accuracy, confusion matrix and sample outputs of a trained run: on the GPU for a
    GPU variant's run (its engine, checked against the CPU layers on a sample first), else on the CPU."""
    message:
        job_message(f"evaluate: {RUN_NAME}")
    input:
        weights=f"{R}/runs/{M}/{RUN}/weights.npz",
        data=f"{R}/data/prepared/{{dataset}}/{{split}}.npz",
    output:
        f"{R}/eval/{M}/{RUN}/eval.json",
        f"{R}/eval/{M}/{RUN}/samples.npz",
        f"{R}/eval/{M}/{RUN}/predictions.npy",
    log:
        job_log("evaluate", f"{M}/{RUN}"),
    benchmark:
        job_benchmark("evaluate", f"{M}/{RUN}")
    params:
        run_dir=folder_of("input"),
        out=folder_of("output"),
        env=job_prefix(gpu=uses_gpu),
    threads: cpu_threads
    resources:
        **rule_resources("evaluate", gpu=uses_gpu),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn evaluate --run {params.run_dir} --data {input.data} --out {params.out}",
            fingerprints=True,
        )


rule time_batches:
    """E3: the MLP's step throughput, forward / backward split and latency per batch size, for one variant."""
    message:
        job_message("time_batches: E3, {wildcards.variant} per batch size")
    output:
        f"{R}/timing/{M}/e3/{{variant}}.csv",
    log:
        job_log("time_batches", f"{M}/{{variant}}"),
    benchmark:
        job_benchmark("time_batches", f"{M}/{{variant}}")
    params:
        e3=config["experiments"]["e3"],
        batches=",".join(str(b) for b in config["experiments"]["e3"]["batches"]),
        env=job_prefix(timed=True, gpu=uses_gpu),
    threads: cpu_threads
    resources:
        **rule_resources("time_batches", timed=True, gpu=uses_gpu),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn time-batches --variants {wildcards.variant} --batches {params.batches} "
            "--hidden {params.e3[hidden]} --features {params.e3[features]} --steps {params.e3[steps]} "
            "--samples {params.e3[samples]} "
            "--timed-epochs {params.e3[timed_epochs]} --repeats {params.e3[repeats]} --out {output}",
            fingerprints=True,
        )


rule sweep_blocks:
    """E3: elementwise, reduction and SGD kernel time per block size and shape, each validated first."""
    message:
        job_message("sweep_blocks: E3, kernel time per block size")
    output:
        f"{R}/timing/{M}/e3/blocks.csv",
    log:
        job_log("sweep_blocks", M),
    benchmark:
        job_benchmark("sweep_blocks", M)
    params:
        blocks=",".join(str(b) for b in config["experiments"]["e3"]["block_sizes"]),
        shapes=",".join(config["experiments"]["e3"]["sweep_shapes"]),
        repeats=config["experiments"]["e3"]["sweep_repeats"],
        env=job_prefix(timed=True, gpu=1),
    threads: 1
    resources:
        **rule_resources("sweep_blocks", timed=True, gpu=gpu_job),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn sweep-blocks --blocks {params.blocks} --shapes {params.shapes} "
            "--repeats {params.repeats} --out {output}",
            fingerprints=True,
        )
