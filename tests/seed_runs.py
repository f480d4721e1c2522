"""A cross-seed experiment on tiny float64 runs, shared by the geometry tests: seeds 1 and 2 and seed 1
again (the same-seed control), each trained and measured at every checkpoint."""

from pathlib import Path

from builders import make_oracle_run

from tiny_llm.geometry.experiment import make_reference, measure_checkpoint
from tiny_llm.geometry.settings import GeometrySettings
from tiny_llm.training.loop import train

SETTINGS = GeometrySettings(
    reference_rows=3,
    cov_num_batches=3,
    cov_batch_size=2,
    top_k=2,
    hutchinson_samples=4,
    lanczos_steps=60,
    hvp_batch_size=2,
)
CHECKPOINTS = ["epoch-000.safetensors", "epoch-001.safetensors", "epoch-002.safetensors"]


def seed_experiment(path: Path):
    """The runs trained in ``path``, their configurations, the reference set and every record."""
    runs = {"s1": 1, "s2": 2, "s1-again": 1}
    configs = {label: make_oracle_run(path, seed=seed) for label, seed in runs.items()}
    for label, config in configs.items():
        train(config, path / label)
    reference = make_reference(configs["s1"], SETTINGS)
    records = {
        label: [
            measure_checkpoint(
                path / label, name, i, reference, SETTINGS, path / "records" / label / f"{name.split('.')[0]}.json"
            )
            for i, name in enumerate(CHECKPOINTS)
        ]
        for label in runs
    }
    return path, configs, reference, records
