"""How jobs report: config keys instead of flags, one line per failed job, refusals."""

import pytest

from tiny_llm.campaign.jobs import config_keys, failed_jobs, refuse, refusing

KEY = "9065847d0fb86fa0fcf613f70b4011d70ab535c271bfceaf429731798226033e"


def test_flags_become_the_config_keys_that_set_them():
    assert config_keys("set a smaller memory_budget_gb (--memory-budget-gb), or --top-k 2", "demo") == (
        "set a smaller memory_budget_gb (analyses.demo.settings.memory_budget_gb), or analyses.demo.spectrum.top_k 2"
    )
    assert config_keys("use --device cpu, not --unknown-flag", None) == "use train_device cpu, not --unknown-flag"


def test_failed_jobs_are_read_from_the_snakemake_log(tmp_path):
    job_log = tmp_path / "seen.log"
    job_log.write_text("Traceback (most recent call last):\n  ...\nValueError: x\nerror: cache shard changed\n")
    main = tmp_path / "snakemake.log"
    main.write_text(f"""[Tue Dec  1]
Error in rule analyze_state:
    message: None
    jobid: 8
    input: runs/tiny/epoch-001.safetensors
    output: results/tiny/states/{KEY}/seen.json
    log: {job_log} (check log file(s) for error details)
Error in rule train_run:
    jobid: 3
    output: runs/tiny/trained.json
Exiting because a job execution failed.
""")
    assert failed_jobs([str(main)]) == [
        f"analyze_state results/tiny/states/{KEY[:12]}…/seen.json: cache shard changed [log: {job_log}]",
        "train_run runs/tiny/trained.json: failed without a message",
    ]
    assert failed_jobs(tmp_path / "missing.log") == []


def test_refusals_print_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        with refusing():
            raise ValueError("analyses.demo.settings.device: cuda, but ...")
    assert stop.value.code == 2 and capsys.readouterr().err == "error: analyses.demo.settings.device: cuda, but ...\n"
    with pytest.raises(SystemExit):
        refuse("x")


def test_a_profile_giving_a_job_of_several_ranks_fewer_cpus_is_refused_and_the_account_named():
    from types import SimpleNamespace

    from tiny_llm.campaign.jobs import charged_lines, check_rank_cpus

    def workflow(analyze_state, default=None):
        settings = SimpleNamespace(overwrite_resources={"analyze_state": analyze_state}, default_resources=default)
        return SimpleNamespace(resource_settings=settings)

    plan = SimpleNamespace(analyses=["big"], ranks=lambda name: {"gpus": 4, "nodes": 1})
    with pytest.raises(ValueError, match=r"analyses.big.gpus_per_job: 4 ranks per node, but the profile gives "
                       r"analyze_state cpus_per_task: 2, fewer CPUs than ranks; set cpus_per_task: 0"):  # fmt: skip
        check_rank_cpus(plan, workflow({"cpus_per_task": 2}))
    check_rank_cpus(plan, workflow({"cpus_per_task": 0, "cpus_per_gpu": 72}))  # CPUs per GPU: they scale
    check_rank_cpus(plan, workflow({}, {"cpus_per_task": 4}))  # the default: enough
    with pytest.raises(ValueError, match="cpus_per_task: 1"):
        check_rank_cpus(plan, workflow({}, {"cpus_per_task": "1"}))  # a profile's value as a string
    check_rank_cpus(plan, workflow({}))  # a local run: nothing given
    charged = charged_lines(workflow({"slurm_account": "other"}, {"slurm_account": "'mine'", "slurm_partition": "gpu"}))
    assert charged == [
        "Slurm: jobs are charged to account mine, partition gpu (the profile's default-resources; change them there)",
        "Slurm: analyze_state jobs: slurm_account=other",
    ]
    assert charged_lines(workflow({})) == []
