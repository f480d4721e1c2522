# Analysis: one job per (parameter state, data case); both cases of a state form one group job.


rule analyze_state:
    input:
        checkpoint=get_state_checkpoint,
        timing=get_calibration,
    output:
        result="results/{analysis}/states/{key}/{case}.json",
    log:
        "logs/analyze_state/{analysis}/{key}/{case}.log",
    benchmark:
        "results/benchmarks/analyze_state/{analysis}/{key}/{case}.tsv"
    group:
        "analysis"
    conda:
        "../../envs/tiny-llm.yaml"
    # CPU threads torch uses (1: many small local jobs side by side; the cluster profile sets more).
    threads: 1
    resources:
        runtime=get_analyze_runtime,
        attempt=get_attempt,
        gpu=get_gpus,
        nodes=get_nodes,
        tasks=get_tasks,
        ranks=get_ranks,
        state_slot=1,
    params:
        run=get_analysis_run,
        settings=get_analysis_settings,
        aliases=get_state_aliases,
        order=get_case_order,
    script:
        "../scripts/analyze_state.py"


# Joins the cases of one state: it makes them one connected group component, so a cluster job
# runs both cases of a state (and --group-components analysis=N runs N states per job).
rule finish_state:
    input:
        results=get_state_results,
        timing=get_calibration,
    output:
        receipt="results/{analysis}/states/{key}/done.json",
    log:
        "logs/finish_state/{analysis}/{key}.log",
    group:
        "analysis"
    conda:
        "../../envs/tiny-llm.yaml"
    resources:
        runtime=get_finish_runtime,
    script:
        "../scripts/finish_state.py"
