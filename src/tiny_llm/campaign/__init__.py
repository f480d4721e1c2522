"""Planning and running a campaign: what the workflow computes from its configuration (workflow:
the plan, which checks a configuration and plans each analysis and seed experiment into a typed
campaign (planned) that its parts take: targets (targets), walltimes and calibrations (walltimes)
and cost report (costs); runs and caches (runs); checks: what a configuration must satisfy), the
cost arithmetic of an analysis before it runs and its walltime (plan), measured timing entries
(timing) and the job that measures them (calibration), the Snakemake jobs' process set-up (jobs),
and Slurm job states and earlier controllers' jobs with the re-attach decisions (slurm_states,
slurm_jobs).

Names are imported on first use, so that the planner never imports the calibration job's
measurement (the worker) it does not run.
"""

from tiny_llm.lazy import exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.campaign.checks": ["expand_seed_experiments", "typed_profile_values"],
        "tiny_llm.campaign.plan": [
            "MAX_HOURS",
            "CaseWork",
            "ClusterSettings",
            "case_work",
            "cost_line",
            "estimate_seconds",
            "expected_states",
            "format_seconds",
            "job_minutes",
        ],
        "tiny_llm.campaign.slurm_jobs": [
            "AWAITABLE",
            "STANDS_IN",
            "EarlierJob",
            "awaited_outputs",
            "cancel",
            "earlier_jobs",
            "job_state",
            "parse_target_jobs",
            "sort_earlier_jobs",
            "wait_for_job",
        ],
        "tiny_llm.campaign.slurm_states": ["first_words", "keep_running_jobs_on_interrupt", "normalise_plugin_states"],
        "tiny_llm.campaign.targets": ["all_targets"],
        "tiny_llm.campaign.calibration": ["calibrate"],
        "tiny_llm.campaign.timing": ["load_profiles", "lookup", "lookup_entry", "timing_key", "write_profile"],
        "tiny_llm.campaign.workflow": ["WorkflowPlan"],
        "tiny_llm.campaign.planned": ["AnalysisPlan", "Campaign", "ExperimentPlan"],
    },
)
