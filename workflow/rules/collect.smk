# Collection: validate every result, then write manifest.json, summary.csv and blocks.csv.


rule collect:
    input:
        states="results/{analysis}/states.json",
        receipts=get_state_receipts,
    output:
        manifest=report(
            "results/{analysis}/manifest.json", category="Collected results"
        ),
        summary=report("results/{analysis}/summary.csv", category="Collected results"),
        blocks=report("results/{analysis}/blocks.csv", category="Collected results"),
    log:
        "logs/collect/{analysis}.log",
    localrule: True
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        cases=get_analysis_cases,
        audit_threshold=lookup(
            dpath="{analysis}/audit_threshold", within=ANALYSES, default=0.01
        ),
    script:
        "../scripts/collect.py"
