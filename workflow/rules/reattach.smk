# Re-attaching to the Slurm jobs of an earlier controller (a lost login session, SIGKILL, Ctrl-C).
# A result that such a job, still running, is computing is the output of a local job that waits
# for it (tiny_llm.campaign.slurm_jobs), not of a new Slurm job. These rules apply only to such outputs
# (elsewhere their input is a file that no rule makes, so the ordinary rules apply). Their inputs
# and params equal those of the rules they stand in for, so the finished result is recorded as if
# made by them and a later run reuses it. Their outputs are marked update(): Snakemake would
# otherwise delete a result that the earlier job has already written before the waiting job starts.
# Only the controller has them (a Slurm job's own Snakemake runs exactly the jobs it was given).

if workflow.is_main_process:

    rule await_result:
        input:
            checkpoint=EARLIER.when_awaited("states", get_state_checkpoint),
            timing=EARLIER.when_awaited("states", get_calibration),
        output:
            result=update("results/{analysis}/states/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/{case}.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=EARLIER.earlier_job("states"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
            aliases=get_state_aliases,
            order=get_case_order,
            successor=get_successor,
        script:
            "../scripts/await_earlier_job.py"

    rule await_receipt:
        input:
            results=EARLIER.when_awaited("states", get_state_results, "done"),
            timing=EARLIER.when_awaited("states", get_calibration, "done"),
        output:
            receipt=update("results/{analysis}/states/{key}/done.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/done.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=EARLIER.earlier_job("states", "done"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        script:
            "../scripts/await_earlier_job.py"

    rule await_spectrum:
        input:
            checkpoint=EARLIER.when_awaited("spectra", get_state_checkpoint),
        output:
            result=update("results/{analysis}/spectra/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/spectra/{key}/{case}.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=EARLIER.earlier_job("spectra"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
            spectrum=get_spectrum_settings,
            aliases=get_state_aliases,
            successor=get_successor,
            order=get_case_order,
        script:
            "../scripts/await_earlier_job.py"

    ruleorder: await_result > analyze_state
    ruleorder: await_receipt > finish_state
    ruleorder: await_spectrum > analyze_spectrum
