# gpunn: the whole reproduction, download -> prepare -> train -> evaluate -> features -> SVM -> report.
#   snakemake --cores 4                                   everything enabled in config/config.yaml
#   snakemake --cores 2 --configfile config/smoke.yaml    the same DAG on tiny offline data
#   snakemake --cores 4 e1                                one experiment (see --list-target-rules)
# The logic lives in src/gpunn; rules only call its command line. Paths are described in docs/outputs.md: every
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


# One target rule per experiment (gpunn.experiments), named after it: `snakemake e4` builds every output of E4.
for _experiment in experiments.ALL:

    rule:
        name:
            _experiment.name
        message:
            job_message(f"{_experiment.name}: every output of {_experiment.name.upper()}: {_experiment.description}")
        localrule: True
        input:
            target_inputs([_experiment.name]),

    workflow.get_rule(_experiment.name).docstring = f"{_experiment.name.upper()}: {_experiment.description}."
