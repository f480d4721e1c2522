"""Training runs: the training loop with interval checkpoints, packed local SGD (several workers
averaged every sync period), resuming an interrupted run, and the training log.
"""

from tiny_llm.training.loop import accumulate_batch_gradient, average_states, learning_rate, run_summary, train

__all__ = ["accumulate_batch_gradient", "average_states", "learning_rate", "run_summary", "train"]
