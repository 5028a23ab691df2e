# Stage 1: data. Offline datasets are generated in their true on-disk formats, then every dataset goes
# through the same download (md5-verified, mirrors in order) and prepare (parse, check, cache) steps.


rule make_offline:
    """Write an offline dataset (synthetic_*, digits*) as IDX gzip / CIFAR-10 binary tar.gz."""
    output:
        "results/offline/{dataset}/manifest.json",
    log:
        "results/logs/make_offline/{dataset}.log",
    conda:
        ENV_FILE
    shell:
        "python -m gpunn make-offline {wildcards.dataset} --out results/offline/{wildcards.dataset} > {log} 2>&1"


rule download:
    """Fetch and md5-verify a dataset's files: config data.mirror_dir first, then the known mirrors."""
    input:
        download_input,
    output:
        "results/data/raw/{dataset}/manifest.json",
    log:
        "results/logs/download/{dataset}.log",
    params:
        mirrors=download_mirrors,
        timeout=config["data"]["timeout_s"],
    conda:
        ENV_FILE
    shell:
        "python -m gpunn download {wildcards.dataset} --dest results/data/raw/{wildcards.dataset} {params.mirrors} "
        "--timeout {params.timeout} 2>&1 | tee {log}"


rule prepare:
    """Parse and check a dataset, cache one split (standard, or E2's sub-split of the training set)."""
    input:
        "results/data/raw/{dataset}/manifest.json",
    output:
        "results/data/prepared/{dataset}/{split}.npz",
    log:
        "results/logs/prepare/{dataset}/{split}.log",
    params:
        e2=config["splits"]["e2"],
    conda:
        ENV_FILE
    shell:
        "python -m gpunn prepare {wildcards.dataset} --raw results/data/raw/{wildcards.dataset} --out {output} "
        "--split {wildcards.split} --e2-train {params.e2[train]} --e2-test {params.e2[test]} "
        "--seed {params.e2[seed]} > {log} 2>&1"
