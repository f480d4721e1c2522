# Cross-seed experiments (seed_experiments.<name>): the runs are trained by train_run; here the
# reference set is cut once, every checkpoint of every run is measured on it, and the seeds are
# compared at matched steps (comparison.csv, dashboard). `snakemake -c1 seeds` runs only these.


# A checkpoint: while a calibration is pending, the measurement jobs are created once the
# reference exists, and the reference waits for the calibration, so their walltimes come from it.
checkpoint geometry_reference:
    input:
        cache=get_reference_cache,
        timing=get_geometry_calibration,
    output:
        reference="results/{experiment}/reference.json",
    log:
        "logs/geometry_reference/{experiment}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        run_config=get_reference_run_config,
        settings=get_geometry_settings,
    script:
        "../scripts/geometry_reference.py"


rule measure_geometry:
    input:
        trained=get_run_receipt,
        reference="results/{experiment}/reference.json",
    output:
        record="results/{experiment}/geometry/{run}/{checkpoint}.json",
        vectors="results/{experiment}/geometry/{run}/{checkpoint}.safetensors",
    log:
        "logs/measure_geometry/{experiment}/{run}/{checkpoint}.log",
    conda:
        "../../envs/tiny-llm.yaml"
    threads: 1
    resources:
        runtime=get_geometry_runtime,
    params:
        settings=get_geometry_settings,
    script:
        "../scripts/measure_geometry.py"


rule compare_seeds:
    input:
        records=get_experiment_records,
    output:
        comparison=report(
            "results/{experiment}/comparison.csv", category="Seed experiments"
        ),
        figures=multiext("results/{experiment}/figures/dashboard", ".pdf", ".png"),
    log:
        "logs/compare_seeds/{experiment}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        roles=get_experiment_roles,
    script:
        "../scripts/compare_seeds.py"


rule compare_experiments:
    input:
        comparisons=get_compared_experiments,
    output:
        figures=multiext("results/comparisons/{comparison}/comparison", ".pdf", ".png"),
    log:
        "logs/compare_experiments/{comparison}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        entry=get_comparison_entry,
    script:
        "../scripts/compare_experiments.py"


# `snakemake -c1 seeds`: every seed experiment and comparison, nothing else.
rule seeds:
    input:
        experiment_targets(PLAN.campaign, PLAN.walltimes),
    localrule: True


# A study across seeds (seed_studies.<name>): the seeds' analyses side by side (seeds.csv, figure).
rule seed_study:
    input:
        summaries=lambda w: list(PLAN.seed_studies[w.study].summaries().values()),
    output:
        table="results/{study}/seeds.csv",
        figures=expand("results/{{study}}/figures/seeds.{ext}", ext=("pdf", "png")),
    log:
        "logs/seed_study/{study}.log",
    wildcard_constraints:
        study="|".join(PLAN.seed_studies) or "NONE",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        summaries=lambda w: PLAN.seed_studies[w.study].summaries(),
        shared=lambda w: list(PLAN.seed_studies[w.study].shared),
    script:
        "../scripts/seed_study.py"
