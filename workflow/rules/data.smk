# Stage 1: data. Offline datasets are generated in their true on-disk formats, then every dataset goes
# through the same download (md5-verified, mirrors in order) and prepare (verify, parse, check, cache) steps.
# Data outputs are shared by every machine: <results_dir>/offline, data/raw, data/prepared.


rule make_offline:
    """Write an offline dataset (synthetic_*, digits*) as IDX gzip / CIFAR-10 binary tar.gz."""
    message:
        job_message("make_offline: {wildcards.dataset}")
    localrule: True  # seconds of work; on a cluster, beside the downloads that read its files
    output:
        f"{R}/offline/{{dataset}}/manifest.json",
    log:
        job_log("make_offline", "{dataset}"),
    benchmark:
        job_benchmark("make_offline", "{dataset}")
    params:
        out=folder_of("output"),
    conda:
        ENV_FILE
    shell:
        logged("python -m gpunn make-offline {wildcards.dataset} --out {params.out}")


# One download rule per file format, since a rule's outputs cannot depend on the dataset: the outputs are the
# files themselves (removing one re-fetches it) and manifest.json, which marks a complete, verified download.
for _kind, _names in RAW_FILES_BY_KIND.items():

    rule:
        name:
            f"download_{_kind}"
        localrule: True  # on a cluster, compute nodes often have no internet: downloads run where Snakemake runs
        message:
            job_message(f"download_{_kind}: {{wildcards.dataset}}")
        input:
            download_input,
        output:
            manifest=f"{R}/data/raw/{{dataset}}/manifest.json",
            files=[f"{R}/data/raw/{{dataset}}/{name}" for name in _names],
        log:
            job_log("download", "{dataset}"),
        benchmark:
            job_benchmark("download", "{dataset}")
        wildcard_constraints:
            dataset="|".join(n for n, spec in DATASETS.items() if spec.kind == _kind),
        params:
            dest=folder_of("output"),
            offline=offline_mirror,
        conda:
            ENV_FILE
        shell:
            # the mirror folder and timeout come from the environment (common.smk), not params: changing them
            # reruns nothing, since every file is verified against its checksums whatever its source
            logged(
                "python -m gpunn download {wildcards.dataset} --dest {params.dest} "
                '${{GPUNN_MIRRORS:+--mirror "$GPUNN_MIRRORS"}} {params.offline} --timeout "${{GPUNN_DOWNLOAD_TIMEOUT:-30}}"'
            )


rule prepare:
    """Verify a dataset's raw files against its manifest and the registry, parse and check them, cache one
    split (standard, or E2's sub-split of the training set)."""
    message:
        job_message("prepare: {wildcards.dataset}, {wildcards.split} split")
    input:
        raw_files,
    output:
        f"{R}/data/prepared/{{dataset}}/{{split}}.npz",
    log:
        job_log("prepare", "{dataset}/{split}"),
    benchmark:
        job_benchmark("prepare", "{dataset}/{split}")
    params:
        raw=folder_of("input"),
        split=split_options,
    resources:
        **rule_resources("prepare"),
    conda:
        ENV_FILE
    shell:
        logged(
            "python -m gpunn prepare {wildcards.dataset} --raw {params.raw} --out {output} "
            "--split {wildcards.split} {params.split}",
            fingerprints=True,
        )
