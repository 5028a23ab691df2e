# Stage 2: training and evaluation. One rule serves every dataset, model, variant and hyperparameter set:
# GPU variants and sweeps are new wildcard values. Training is timed, so at most one runs at a time
# (resource `timing`, limited to 1 in profiles/default).


rule train:
    """Train one run; metrics.csv has one row per epoch."""
    input:
        "results/data/prepared/{dataset}/{split}.npz",
    output:
        metrics=f"results/runs/{RUN}/metrics.json",
        curve=f"results/runs/{RUN}/metrics.csv",
        weights=f"results/runs/{RUN}/weights.npz",
    log:
        f"results/logs/train/{RUN}.log",
    params:
        run=run_path,
        env=variant_env,
    threads: cpu_threads
    resources:
        timing=1,
        gpu=uses_gpu,
    conda:
        ENV_FILE
    shell:
        "{params.env}python -m gpunn train {params.run} --data {input} --out results/runs/{params.run} 2>&1 | tee {log}"


rule evaluate:
    """Test-set metrics, per-class accuracy, confusion matrix and sample outputs of a trained run."""
    input:
        weights=f"results/runs/{RUN}/weights.npz",
        data="results/data/prepared/{dataset}/{split}.npz",
    output:
        f"results/eval/{RUN}/eval.json",
        f"results/eval/{RUN}/samples.npz",
        f"results/eval/{RUN}/predictions.npy",
    log:
        f"results/logs/evaluate/{RUN}.log",
    params:
        run=run_path,
    threads: config["threads"]
    conda:
        ENV_FILE
    shell:
        "python -m gpunn evaluate --run results/runs/{params.run} --data {input.data} "
        "--out results/eval/{params.run} > {log} 2>&1"


rule time_batches:
    """E3: forward, backward and step time of the MLP per batch size, for one variant."""
    output:
        "results/timing/e3/{variant}.csv",
    log:
        "results/logs/time_batches/{variant}.log",
    params:
        e3=config["experiments"]["e3"],
        batches=",".join(str(b) for b in config["experiments"]["e3"]["batches"]),
        env=variant_env,
    threads: cpu_threads
    resources:
        timing=1,
        gpu=uses_gpu,
    conda:
        ENV_FILE
    shell:
        "{params.env}python -m gpunn time-batches --variants {wildcards.variant} --batches {params.batches} "
        "--hidden {params.e3[hidden]} --features {params.e3[features]} --repeats {params.e3[repeats]} --out {output} > {log} 2>&1"


rule sweep_blocks:
    """E3: elementwise, reduction and SGD kernel time per block size and shape, each validated first."""
    output:
        "results/timing/e3/blocks.csv",
    log:
        "results/logs/sweep_blocks.log",
    params:
        blocks=",".join(str(b) for b in config["experiments"]["e3"]["block_sizes"]),
        shapes=",".join(config["experiments"]["e3"]["sweep_shapes"]),
        repeats=config["experiments"]["e3"]["sweep_repeats"],
        env=gpu_env(True),
    threads: 1
    resources:
        timing=1,
        gpu=1,
    conda:
        ENV_FILE
    shell:
        "{params.env}python -m gpunn sweep-blocks --blocks {params.blocks} --shapes {params.shapes} "
        "--repeats {params.repeats} --out {output} > {log} 2>&1"
