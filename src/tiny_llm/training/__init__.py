"""Training runs: the training loop with interval checkpoints, packed local SGD (several workers
averaged every sync period), resuming an interrupted run, and the training log (``loop``); the
learning-rate schedule (``schedule``); branches, runs that start from a state another run kept
(``branches``).

Names are imported on first use, so that the planner, which prices branches, imports no torch.
"""

from tiny_llm.lazy import exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.training.loop": ["accumulate_batch_gradient", "average_states", "run_summary", "train"],
        "tiny_llm.training.schedule": ["learning_rate"],
        "tiny_llm.training.branches": [
            "branch_overrides",
            "branch_region",
            "held_out_blocks",
            "held_out_loss",
            "load_start",
            "lr_factor",
            "measure_branches",
            "state_path",
        ],
    },
)
