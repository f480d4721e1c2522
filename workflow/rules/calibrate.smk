# Calibration: measure per-micro-batch timings of an analysis's setup on the node that will run it.


rule calibrate_timing:
    input:
        get_calibration_inputs,
    output:
        profile="results/timing/{analysis}.json",
    log:
        "logs/calibrate_timing/{analysis}.log",
    conda:
        "../../envs/tiny-llm.yaml"
    threads: 1
    params:
        run_config=get_analysis_run_config,
        settings=get_analysis_settings,
    script:
        "../scripts/calibrate_timing.py"


# `snakemake --profile profiles/naiss calibrate`: one short job per analysis.
rule calibrate:
    input:
        expand("results/timing/{analysis}.json", analysis=ANALYSES),
    localrule: True
