# tiny-llm curvature: token caches -> training runs -> unique states -> per-(state, case) results
# -> manifest.json + summary.csv -> figures. Stages live in workflow/rules/<stage>.smk.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/index.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/plot.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/spectrum.smk"
include: "workflow/rules/seeds.smk"
include: "workflow/rules/cbs.smk"
include: "workflow/rules/reattach.smk"


# Snakemake would otherwise inspect each input function's signature at every call.
jobs.remember_signatures(globals())


rule all:
    default_target: True
    input:
        get_all_targets,
