# tiny-llm curvature: prepare token caches, train runs (analysis stages follow in later rules).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"


rule all:
    input:
        get_all_targets(),
