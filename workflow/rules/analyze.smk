# Analysis: one job per (parameter state, data case); both cases of a state form one group job,
# and a cluster job runs cluster.states_per_job such groups (one group name per analysis).


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
        get_state_group
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
        successor=get_successor,
    script:
        "../scripts/analyze_state.py"


# Joins the cases of one state: it makes them one connected group component, so a cluster job
# runs both cases of a state (and cluster.states_per_job such components one after another).
rule finish_state:
    input:
        results=get_state_results,
        timing=get_calibration,
    output:
        receipt="results/{analysis}/states/{key}/done.json",
    log:
        "logs/finish_state/{analysis}/{key}.log",
    group:
        get_state_group
    conda:
        "../../envs/tiny-llm.yaml"
    resources:
        runtime=get_finish_runtime,
        state_slot=1,  # one at a time in a job of several states (memory is not summed)
    script:
        "../scripts/finish_state.py"
