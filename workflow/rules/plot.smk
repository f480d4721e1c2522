# Figures: drawn from summary.csv and manifest.json only (plus the training log when asked).


rule plot:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
        training_log=get_training_log,
    output:
        # One report entry per figure, captioned from docs/reading-results.md.
        **figure_reports(FIGURE_RULES["plot"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png", figure=FIGURE_RULES["plot"]
        ),
    log:
        "logs/plot/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        training_norms=lookup(dpath="training_norms", within=PLOTS, default=False),
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot.py"


# The figures of the optimizer's geometry and of the step to the next checkpoint: only for analyses
# that can have something to draw there (the plan says in its notes why one has none).
rule plot_preconditioned:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
    output:
        **figure_reports(FIGURE_RULES["plot_preconditioned"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png",
            figure=FIGURE_RULES["plot_preconditioned"],
        ),
    log:
        "logs/plot_preconditioned/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot.py"


rule plot_trajectory:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
    output:
        **figure_reports(FIGURE_RULES["plot_trajectory"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png",
            figure=FIGURE_RULES["plot_trajectory"],
        ),
    log:
        "logs/plot_trajectory/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot.py"


# The precision audit's figure: only for audited analyses (a float64 analysis has no audit).
rule plot_audit:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
    output:
        **figure_reports(FIGURE_RULES["plot_audit"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png",
            figure=FIGURE_RULES["plot_audit"],
        ),
    log:
        "logs/plot_audit/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot.py"
