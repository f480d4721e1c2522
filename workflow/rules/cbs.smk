# Critical-batch-size experiments (cbs_experiments.<name>): the base run, its branches and its
# analysis are ordinary train_run and analysis jobs; here each checkpoint's branches are measured
# on held-out data, and the critical batch size is put beside B_simple and B_noise.
# `snakemake -c1 cbs` runs only these.
CBS = PLAN.cbs


rule evaluate_branches:
    input:
        branches=lambda w: CBS[w.cbs].receipts(w.checkpoint),
    output:
        record="results/{cbs}/branches/{checkpoint}.json",
    log:
        "logs/evaluate_branches/{cbs}/{checkpoint}.log",
    wildcard_constraints:
        cbs="|".join(CBS) or "NONE",
    conda:
        "../../envs/tiny-llm.yaml"
    threads: 1
    params:
        spec=lambda w: CBS[w.cbs].evaluation(w.checkpoint, PLAN.train_device),
    script:
        "../scripts/evaluate_branches.py"


rule critical_batch:
    input:
        records=lambda w: CBS[w.cbs].records(),
        summary="results/{cbs}/summary.csv",
    output:
        table=report("results/{cbs}/cbs.csv", category="Critical batch size"),
        branches="results/{cbs}/branches.csv",
        fits="results/{cbs}/fits.csv",
        curves="results/{cbs}/curves.csv",
        rates="results/{cbs}/rates.csv",
        figures=multiext("results/{cbs}/figures/critical_batch", ".pdf", ".png"),
    log:
        "logs/critical_batch/{cbs}.log",
    wildcard_constraints:
        cbs="|".join(CBS) or "NONE",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        case=lambda w: CBS[w.cbs].case,
        epsilon=lambda w: CBS[w.cbs].epsilon,
        seq_len=lambda w: CBS[w.cbs].base_config.data.seq_len,
        base_batch=lambda w: CBS[w.cbs].base_batch,
    script:
        "../scripts/critical_batch.py"


# `snakemake -c1 cbs`: every critical-batch-size experiment, nothing else.
rule cbs:
    input:
        [target for plan in CBS.values() for target in plan.targets()],
    localrule: True
