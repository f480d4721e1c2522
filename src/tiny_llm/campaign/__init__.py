"""Planning and running a campaign: what the workflow computes from its configuration (workflow:
the plan, a facade over its runs and caches (runs), targets (targets), walltimes and calibrations
(walltimes) and cost report (costs); checks: what a configuration must satisfy), the cost
arithmetic of an analysis before it runs and its walltime (plan), measured timing entries
(timing), the Snakemake jobs' process set-up (jobs), and Slurm job states and earlier controllers'
jobs with the re-attach decisions (slurm_states, slurm_jobs).
"""

from tiny_llm.campaign.checks import expand_seed_experiments, typed_profile_values
from tiny_llm.campaign.plan import (
    MAX_HOURS,
    CaseWork,
    ClusterSettings,
    case_work,
    cost_line,
    estimate_seconds,
    expected_states,
    format_seconds,
    job_minutes,
)
from tiny_llm.campaign.slurm_jobs import (
    AWAITABLE,
    STANDS_IN,
    EarlierJob,
    awaited_outputs,
    cancel,
    earlier_jobs,
    job_state,
    parse_target_jobs,
    sort_earlier_jobs,
    wait_for_job,
)
from tiny_llm.campaign.slurm_states import first_words, keep_running_jobs_on_interrupt, normalise_plugin_states
from tiny_llm.campaign.targets import all_targets
from tiny_llm.campaign.timing import calibrate, load_profiles, lookup, lookup_entry, timing_key, write_profile
from tiny_llm.campaign.workflow import WorkflowPlan

__all__ = [
    "AWAITABLE",
    "CaseWork",
    "ClusterSettings",
    "EarlierJob",
    "MAX_HOURS",
    "STANDS_IN",
    "WorkflowPlan",
    "all_targets",
    "awaited_outputs",
    "calibrate",
    "cancel",
    "case_work",
    "cost_line",
    "earlier_jobs",
    "estimate_seconds",
    "expand_seed_experiments",
    "expected_states",
    "first_words",
    "format_seconds",
    "job_minutes",
    "job_state",
    "keep_running_jobs_on_interrupt",
    "load_profiles",
    "lookup",
    "lookup_entry",
    "normalise_plugin_states",
    "parse_target_jobs",
    "sort_earlier_jobs",
    "timing_key",
    "typed_profile_values",
    "wait_for_job",
    "write_profile",
]
