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


# The same measurement for a seed experiment's setup (its checkpoint measurements' walltimes).
rule calibrate_geometry:
    output:
        profile="results/timing/{experiment}.json",
    log:
        "logs/calibrate_timing/{experiment}.log",
    conda:
        "../../envs/tiny-llm.yaml"
    threads: 1
    params:
        run_config=get_reference_run_config,
        settings=get_geometry_calibration_settings,
    script:
        "../scripts/calibrate_timing.py"


# `snakemake --profile profiles/naiss calibrate`: one short job per analysis and seed experiment.
rule calibrate:
    input:
        expand("results/timing/{analysis}.json", analysis=ANALYSES),
        expand("results/timing/{experiment}.json", experiment=SEED_EXPERIMENTS),
    localrule: True
