# Figures: drawn from summary.csv and manifest.json only (plus the training log when asked).


rule plot:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
        training_log=get_training_log,
    output:
        # One report entry per figure, captioned from docs/reading-results.md.
        **figure_reports(FIGURES),
        png=expand("results/{{analysis}}/figures/{figure}.png", figure=FIGURES),
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


# The precision audit's figure: only for audited analyses (a float64 analysis has no audit).
rule plot_audit:
    input:
        manifest="results/{analysis}/manifest.json",
        summary="results/{analysis}/summary.csv",
    output:
        **figure_reports(AUDIT_FIGURES),
        png=expand("results/{{analysis}}/figures/{figure}.png", figure=AUDIT_FIGURES),
    log:
        "logs/plot_audit/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot.py"
