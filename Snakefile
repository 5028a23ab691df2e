# gpunn: the whole reproduction, download -> prepare -> train -> evaluate -> features -> SVM -> report.
#   snakemake --cores 4                                   everything enabled in config/config.yaml
#   snakemake --cores 2 --configfile config/smoke.yaml    the same DAG on tiny offline data
#   snakemake --cores 4 e1                                one experiment (see --list-target-rules)
# The logic lives in src/gpunn; rules only call its command line. Paths are described in the README: every
# output goes under config key results_dir (default results/), measured ones also under the machine's name.

from snakemake.utils import min_version

min_version("9.0")


# config/config.yaml is the base that --configfile and --config extend (read in common.smk: a `configfile:`
# directive here would print that it "is extended by additional config" on every run with the smoke config)
include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


# snakemake --report: its first page is the entry page (report_index's index.rst) once built
report: report_front_page()


rule all:
    """Every enabled experiment, then the report's entry page, <results_dir>/report/<machine>/index.md."""
    message:
        job_message("all: every enabled experiment and the entry page")
    localrule: True
    input:
        target_inputs(enabled_experiments(config)),
        index_outputs(config),


rule e1:
    """E1: MLP 784-256-10 on MNIST per variant: time, accuracy, speedups, loss curves."""
    message:
        job_message("e1: every output of E1")
    localrule: True
    input:
        target_inputs(["e1"]),


rule e2:
    """E2: MLP hidden x batch sweep on the 37 800 / 4 200 split: train, forward, backward time, accuracy."""
    message:
        job_message("e2: every output of E2")
    localrule: True
    input:
        target_inputs(["e2"]),


rule e3:
    """E3: MLP step throughput, forward / backward split and latency per batch size and variant."""
    message:
        job_message("e3: every output of E3")
    localrule: True
    input:
        target_inputs(["e3"]),


rule e4:
    """E4: CNN on MNIST and Fashion-MNIST per variant."""
    message:
        job_message("e4: every output of E4")
    localrule: True
    input:
        target_inputs(["e4"]),


rule e5:
    """E5: convolutional autoencoder on CIFAR-10: epoch time, MSE, reconstructions."""
    message:
        job_message("e5: every output of E5")
    localrule: True
    input:
        target_inputs(["e5"]),


rule e6:
    """E6: RBF SVM on the autoencoder's encoder features: accuracy, confusion matrix."""
    message:
        job_message("e6: every output of E6")
    localrule: True
    input:
        target_inputs(["e6"]),
