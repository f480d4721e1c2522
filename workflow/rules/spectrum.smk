# Spectra (analyses.<name>.spectrum.enabled): Lanczos, SLQ, CG and block-diagonal errors per
# (state, case), in the same group job as the noise statistics; spectrum.csv; spectral figures.


rule analyze_spectrum:
    input:
        checkpoint=get_state_checkpoint,
    output:
        result="results/{analysis}/spectra/{key}/{case}.json",
    log:
        "logs/analyze_spectrum/{analysis}/{key}/{case}.log",
    benchmark:
        "results/benchmarks/analyze_spectrum/{analysis}/{key}/{case}.tsv"
    group:
        get_state_group
    conda:
        "../../envs/tiny-llm.yaml"
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
        spectrum=get_spectrum_settings,
        aliases=get_state_aliases,
        successor=get_successor,  # its step's share in the top eigenspace
        order=get_case_order,  # a training order's window, or None
    script:
        "../scripts/analyze_spectrum.py"


rule collect_spectrum:
    input:
        states="results/{analysis}/states.json",
        receipts=get_state_receipts,
    output:
        spectrum=report("results/{analysis}/spectrum.csv", category="Collected results"),
    log:
        "logs/collect_spectrum/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        cases=get_analysis_cases,
    script:
        "../scripts/collect_spectrum.py"


rule plot_spectrum:
    input:
        spectrum="results/{analysis}/spectrum.csv",
    output:
        **figure_reports(FIGURE_RULES["plot_spectrum"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png",
            figure=FIGURE_RULES["plot_spectrum"],
        ),
    log:
        "logs/plot_spectrum/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot_spectrum.py"


# λ_max(PH) beside the stability threshold: only where a state may have the optimizer's preconditioner.
rule plot_spectrum_preconditioned:
    input:
        spectrum="results/{analysis}/spectrum.csv",
    output:
        **figure_reports(FIGURE_RULES["plot_spectrum_preconditioned"]),
        png=expand(
            "results/{{analysis}}/figures/{figure}.png",
            figure=FIGURE_RULES["plot_spectrum_preconditioned"],
        ),
    log:
        "logs/plot_spectrum_preconditioned/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        x_axis=lookup(dpath="x_axis", within=PLOTS, default="auto"),
    script:
        "../scripts/plot_spectrum.py"
