# Training: runs/<name>/ with resolved.yaml, checkpoints, final.pt and train-log.jsonl.
from tiny_llm.campaign.cbs import branch_plans, parent_receipt

# A branch of a critical-batch-size experiment starts from a state its parent run kept.
get_branch_parent = _by("run", lambda run: parent_receipt(PLAN.train_runs, run))


rule train_run:
    input:
        cache=get_cache_receipt,
        parent=get_branch_parent,
    output:
        # A receipt, not the checkpoints: Snakemake deletes a job's declared outputs before
        # rerunning it and after a failure. The run directory itself belongs to tiny-llm, which
        # resumes interrupted runs and refuses changed settings without touching finished files.
        receipt="runs/{run}/trained.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "results/benchmarks/train_run/{run}.tsv"
    conda:
        "../../envs/tiny-llm.yaml"
    threads: 1
    params:
        run_config=get_run_config_dict,
        device=config.get("train_device", "cpu"),
    script:
        "../scripts/train.py"


# A critical-batch-size branch trains as any run; on the cluster it asks for the base run's
# walltime (the profile's train_run runtime) scaled by its share of the base run's tokens.
use rule train_run as train_branch with:
    wildcard_constraints:
        run="|".join(branch_plans(PLAN.cbs)) or "NONE",
    resources:
        runtime=lambda w: jobs.branch_runtime(PLAN, workflow, w.run),


ruleorder: train_branch > train_run


# Hugging Face checkpoints an analysis lists (hf_checkpoints): imported into its run directory.
rule import_hf:
    input:
        get_import_inputs,
    output:
        # A receipt, written last (see train_run): the run directory belongs to tiny-llm.
        receipt="runs/{imported}/imported.json",
    log:
        "logs/import_hf/{imported}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        spec=get_import_spec,
    script:
        "../scripts/import_hf.py"
