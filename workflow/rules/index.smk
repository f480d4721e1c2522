# Index: hash the selected checkpoints into unique parameter states (results/<analysis>/states.json).


checkpoint index_states:
    input:
        run=get_run_ready,
        # A pending walltime calibration: the analysis jobs are created after the index, with it.
        timing=get_calibration,
    output:
        states="results/{analysis}/states.json",
    log:
        "logs/index_states/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        run=get_analysis_run,
        selection=get_analysis_selection,
        settings=get_analysis_settings,
        binding=get_analysis_binding,
    script:
        "../scripts/index_states.py"
