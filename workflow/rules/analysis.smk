# Stage 3: encoder features of the autoencoder and the SVM on them (E6).

FEATURES = [f"{R}/features/{M}/{RUN}/{name}" for name in FEATURE_FILES]


rule features:
    """Encoder outputs (.npy, float32, N x 8192 for the real autoencoder) for the train and test splits: on the
    GPU for a GPU variant's run (checked against the CPU encoder on a sample first), else on the CPU."""
    message:
        job_message(f"features: {RUN_NAME}")
    input:
        weights=f"{R}/runs/{M}/{RUN}/weights.npz",
        data=f"{R}/data/prepared/{{dataset}}/{{split}}.npz",
    output:
        FEATURES,
    log:
        job_log("features", f"{M}/{RUN}"),
    benchmark:
        job_benchmark("features", f"{M}/{RUN}")
    params:
        run_dir=folder_of("input"),
        out=folder_of("output"),
        train_limit=config["experiments"]["e6"]["feature_train_limit"],
        env=job_prefix(gpu=uses_gpu),
    threads: cpu_threads
    resources:
        **rule_resources("features", gpu=uses_gpu),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn features --run {params.run_dir} --data {input.data} "
            "--out {params.out} --train-limit {params.train_limit}",
            fingerprints=True,
        )


rule svm:
    """StandardScaler + SVC(rbf) (or the documented Nystroem approximation) on encoder features, one job per method
    of experiments.e6.method; the exact route's precomputed kernels on the GPU when experiments.e6.kernel_device says
    so: a borrowed GPU (held only while the kernels are computed, free for GPU jobs while libsvm runs; resource gpu=1
    on a cluster); method gpu-smo solves on the GPU, which it holds for the whole job."""
    message:
        job_message(f"svm {{wildcards.method}}: {RUN_NAME}")
    input:
        FEATURES,
    output:
        # confusion.png: in snakemake --report as report_e6's
        [f"{R}/svm/{M}/{{method}}/{RUN}/{name}" for name in SVM_FILES],
    log:
        job_log("svm", f"{M}/{{method}}/{RUN}"),
    benchmark:
        job_benchmark("svm", f"{M}/{{method}}/{RUN}")
    wildcard_constraints:
        method="|".join(SVM_METHODS),
    params:
        features=folder_of("input"),
        out=folder_of("output"),
        e6=svm_params,
        class_names=lambda wc: ",".join(DATASETS[wc.dataset].class_names),
        kernel_device=lambda wc: svm_kernel_device(wc.method),
        env=job_prefix(timed="both", gpu=svm_uses_gpu, borrow=svm_borrows),
    threads: config["threads"]
    resources:
        **rule_resources("svm", timed="both", gpu=svm_uses_gpu, borrow=svm_borrows),
    conda:
        ENV_FILE
    shell:
        logged(
            "{params.env}python -m gpunn svm --features {params.features} --out {params.out}"
            " --train-subset {params.e6[train_subset]} --test-subset {params.e6[test_subset]}"
            " --method {wildcards.method} --C {params.e6[C]} --gamma {params.e6[gamma]}"
            " --components {params.e6[components]} --seed {params.e6[seed]} --kernel-device {params.kernel_device}"
            " --class-names {params.class_names:q}",
            fingerprints=True,
        )
