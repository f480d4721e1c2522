# Re-attaching to the Slurm jobs of an earlier controller (a lost login session, SIGKILL, Ctrl-C).
# A result that such a job, still running, is computing is the output of a local job that waits
# for it (tiny_llm.slurm_jobs), not of a new Slurm job. These rules exist only while there are
# such jobs; their inputs and params equal those of the rules they stand in for, so the finished
# result is recorded as if made by them and a later run reuses it. Their outputs are marked
# update(): Snakemake would otherwise delete a result the earlier job has already written before
# the waiting job starts.

if AWAITED:

    def _awaited(wildcards, stage, name):
        return f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{name}.json" in AWAITED

    def _when_awaited(stage, function, name=None):
        """The stood-in rule's input when an earlier job writes this output, else a file that no
        rule makes (so that the ordinary rule applies)."""

        def inputs(wildcards):
            if _awaited(wildcards, stage, name or wildcards.case):
                return function(wildcards)
            return NOT_AWAITED

        return inputs

    def _earlier_job(stage, name=None):
        def job(wildcards):
            case = name or wildcards.case
            return AWAITED.get(f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{case}.json", "")

        return job

    rule await_result:
        input:
            checkpoint=_when_awaited("states", get_state_checkpoint),
            timing=_when_awaited("states", get_calibration),
        output:
            result=update("results/{analysis}/states/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/{case}.log",
        localrule: True
        resources:
            earlier_job=_earlier_job("states"),
            poll_seconds=str(CLUSTER["reattach_poll_seconds"]),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
        script:
            "../scripts/await_earlier_job.py"

    rule await_receipt:
        input:
            results=_when_awaited("states", get_state_results, "done"),
            timing=_when_awaited("states", get_calibration, "done"),
        output:
            receipt=update("results/{analysis}/states/{key}/done.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/done.log",
        localrule: True
        resources:
            earlier_job=_earlier_job("states", "done"),
            poll_seconds=str(CLUSTER["reattach_poll_seconds"]),
        script:
            "../scripts/await_earlier_job.py"

    rule await_spectrum:
        input:
            checkpoint=_when_awaited("spectra", get_state_checkpoint),
        output:
            result=update("results/{analysis}/spectra/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/spectra/{key}/{case}.log",
        localrule: True
        resources:
            earlier_job=_earlier_job("spectra"),
            poll_seconds=str(CLUSTER["reattach_poll_seconds"]),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
            spectrum=get_spectrum_settings,
        script:
            "../scripts/await_earlier_job.py"

    ruleorder: await_result > analyze_state
    ruleorder: await_receipt > finish_state
    ruleorder: await_spectrum > analyze_spectrum
