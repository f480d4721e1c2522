"""The file layout of run directories and analysis folders: every name they hold and the paths the
workflow's rules write, in one place (the rules' output patterns are checked against it by a test).

A run directory (``runs/<name>``) holds ``resolved.yaml``, ``epoch-NNN.safetensors`` (NNN = the
virtual epoch, 000 the initialisation), ``final.pt`` and ``resume.pt``, ``train-log.jsonl``,
``node-NNN/`` (the workers of packed runs) and, when the workflow trained it, ``trained.json``; an
imported one ``imported.json`` (and ``tokenizer/``, ``hf-config.json``). An analysis folder
(``results/<name>``) holds ``states.json``, ``states/<key>/<case>.json``, ``manifest.json``,
``summary.csv`` and ``figures/``.

Example:
    >>> epoch_file(3), state_result("demo", "ab12", "seen")
    ('epoch-003.safetensors', 'results/demo/states/ab12/seen.json')
"""

from __future__ import annotations

import re

__all__ = [
    "AUDIT_FIGURES",
    "BLOCKS",
    "EPOCH_FILE",
    "FIGURES",
    "FIGURE_RULES",
    "PRECONDITIONED_FIGURES",
    "TRAJECTORY_FIGURES",
    "FINAL",
    "OPTIMIZER_FILE",
    "IMPORTED",
    "MANIFEST",
    "RESOLVED",
    "RESUME",
    "STATES",
    "SPECTRUM",
    "SPECTRUM_FIGURES",
    "SPECTRUM_RESULT",
    "STATE_DONE",
    "STATE_RESULT",
    "SUMMARY",
    "TRAINED",
    "TRAINER_LOG_SOURCE",
    "TRAIN_LOG",
    "epoch_file",
    "epoch_stem",
    "moments_file",
    "state_file",
    "state_result",
]

RESOLVED = "resolved.yaml"
"""A run's complete configuration."""
IMPORTED = "imported.json"
"""Marks a run directory made by an import: training refuses it (it would overwrite the weights)."""
TRAIN_LOG = "train-log.jsonl"
"""A run's log of every optimizer step (step, tokens, loss, pre-clipping gradient norm)."""
TRAINER_LOG_SOURCE = "trainer_state.json"
"""``source`` of an imported run's training log records, taken from a Trainer's log_history (one
record per logging interval, not per step)."""
OPTIMIZER_FILE = "optimizer.pt"
"""A Hugging Face Trainer checkpoint's optimizer state, beside its weights."""
FINAL = "final.pt"
"""A finished run's training state (weights, optimizer, position)."""
RESUME = "resume.pt"
"""An unfinished run's training state, from which the same command resumes."""
TRAINED = "trained.json"
"""The workflow's receipt of a run it trained."""
STATES = "states.json"
"""An analysis's index of unique parameter states."""
MANIFEST = "manifest.json"
"""An analysis's collected settings, provenance and states."""
SUMMARY = "summary.csv"
"""An analysis's table: one row per checkpoint file and case."""
SPECTRUM = "spectrum.csv"
"""An analysis's spectral table: one row per checkpoint file and case."""
BLOCKS = "blocks.csv"
"""An analysis's per-block table: one row per checkpoint file, case and parameter block."""
EPOCH_FILE = re.compile(r"^epoch-(\d+)\.safetensors$")
"""A root checkpoint written at a virtual epoch (or an imported checkpoint, in its order)."""
STATE_RESULT = "results/{analysis}/states/{key}/{case}.json"
"""One state's result on one case (the analyze_state rule's output pattern)."""
STATE_DONE = "results/{analysis}/states/{key}/done.json"
"""The receipt that every case of a state is measured (the finish_state rule's output pattern)."""
SPECTRUM_RESULT = "results/{analysis}/spectra/{key}/{case}.json"
"""One state's spectrum on one case (the analyze_spectrum rule's output pattern)."""
FIGURES = [
    "loss",
    "normalized_alignment",
    "noise_alignment",
    "gradient_norms",
    "batch_sizes",
    "preconditioned_batch_sizes",
    "block_batch_sizes",
    "step_sharpness",
    "step_loss",
]
"""An analysis's figures (``figures/<name>.pdf`` and ``.png``), drawn by tiny_llm.results.figures."""
AUDIT_FIGURES = ["precision_audit"]
"""Drawn for audited analyses only (``plot_audit``): a float64 analysis has nothing to show there."""
SPECTRUM_FIGURES = ["top_eigenvalues", "preconditioned_sharpness", "slq_density", "block_diagonal_error"]
"""An analysis's spectral figures, drawn by tiny_llm.results.spectrum_figures."""
PRECONDITIONED_FIGURES = ["preconditioned_batch_sizes", "preconditioned_sharpness"]
"""Drawn only where some selected state may have the optimizer's preconditioner (not with
``preconditioned: false``, nor for a suite none of whose checkpoints carry an optimizer state)."""
TRAJECTORY_FIGURES = ["step_sharpness", "step_loss"]
"""Drawn only with ``settings.trajectory`` (the statistics along the step to the next checkpoint)."""
FIGURE_RULES = {
    "plot": [f for f in FIGURES if f not in PRECONDITIONED_FIGURES + TRAJECTORY_FIGURES],
    "plot_preconditioned": [f for f in FIGURES if f in PRECONDITIONED_FIGURES],
    "plot_trajectory": TRAJECTORY_FIGURES,
    "plot_audit": AUDIT_FIGURES,
    "plot_spectrum": [f for f in SPECTRUM_FIGURES if f not in PRECONDITIONED_FIGURES],
    "plot_spectrum_preconditioned": [f for f in SPECTRUM_FIGURES if f in PRECONDITIONED_FIGURES],
}
"""The rule that draws each figure: a figure with nothing to draw for an analysis is not asked for."""


def epoch_stem(epoch: int) -> str:
    """``epoch-NNN``: a virtual epoch's checkpoint name without its suffix."""
    return f"epoch-{epoch:03d}"


def state_file(epoch: int) -> str:
    """``state-NNN.pt``: the whole training state kept at the end of virtual epoch ``epoch``
    (``training.keep_states``), for branches to start from."""
    return f"state-{epoch:03d}.pt"


def epoch_file(epoch: int) -> str:
    """``epoch-NNN.safetensors``: the root weights after virtual epoch ``epoch`` (0: initialisation)."""
    return f"{epoch_stem(epoch)}.safetensors"


def moments_file(checkpoint: str) -> str | None:
    """``moments-NNN.safetensors``: the optimizer's moments kept beside checkpoint
    ``epoch-NNN.safetensors`` (``training.keep_moments``, or a Trainer checkpoint's optimizer.pt
    imported); None for any other checkpoint name (a ``.pt`` state holds its optimizer itself)."""
    match = EPOCH_FILE.match(checkpoint)
    return None if match is None else f"moments-{match.group(1)}.safetensors"


def state_result(analysis: str, key: str, case: str) -> str:
    """The result file of state ``key`` on ``case`` in analysis ``analysis`` (relative to the project)."""
    return STATE_RESULT.format(analysis=analysis, key=key, case=case)
