# Token caches: cache/<name>/meta.json + shards, prepared for the run that uses them.


rule prepare_data:
    input:
        get_cache_inputs,
    output:
        # A receipt beside the cache (see train.smk): an existing cache is never deleted by a
        # rerun; tiny-llm reuses it when identical and refuses other settings.
        receipt="cache/{cache}.prepared.json",
    log:
        "logs/prepare_data/{cache}.log",
    conda:
        "../../envs/tiny-llm.yaml"
    params:
        spec=get_cache_spec,
    script:
        "../scripts/prepare_data.py"
