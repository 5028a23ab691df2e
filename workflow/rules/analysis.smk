# Stage 3: encoder features of the autoencoder and the SVM on them (E6).

FEATURES = [f"results/features/{RUN}/{part}_{kind}.npy" for part in ("train", "test") for kind in ("features", "labels")]


rule features:
    """Encoder outputs (.npy, float32, N x 8192 for the real autoencoder) for the train and test splits."""
    input:
        weights=f"results/runs/{RUN}/weights.npz",
        data="results/data/prepared/{dataset}/{split}.npz",
    output:
        FEATURES,
    log:
        f"results/logs/features/{RUN}.log",
    params:
        run=run_path,
        train_limit=config["experiments"]["e6"]["feature_train_limit"],
    threads: config["threads"]
    conda:
        ENV_FILE
    shell:
        "python -m gpunn features --run results/runs/{params.run} --data {input.data} "
        "--out results/features/{params.run} --train-limit {params.train_limit} 2>&1 | tee {log}"


rule svm:
    """StandardScaler + SVC(rbf) (or the documented Nystroem approximation) on encoder features."""
    input:
        FEATURES,
    output:
        metrics=f"results/svm/{RUN}/metrics.json",
        confusion=f"results/svm/{RUN}/confusion.csv",
        per_class=f"results/svm/{RUN}/per_class.csv",
        figure=report(f"results/svm/{RUN}/confusion.png", caption="../report/confusion.rst", category="E6"),
    log:
        f"results/logs/svm/{RUN}.log",
    params:
        run=run_path,
        e6=config["experiments"]["e6"],
        class_names=lambda wc: ",".join(DATASETS[wc.dataset].class_names),
    threads: config["threads"]
    resources:
        timing=1,
    conda:
        ENV_FILE
    shell:
        "python -m gpunn svm --features results/features/{params.run} --out results/svm/{params.run}"
        " --train-subset {params.e6[train_subset]} --test-subset {params.e6[test_subset]}"
        " --method {params.e6[method]} --C {params.e6[C]} --gamma {params.e6[gamma]}"
        " --components {params.e6[components]} --seed {params.e6[seed]} --class-names {params.class_names:q}"
        " 2>&1 | tee {log}"
