"""Run directories made from local Hugging Face checkpoints (``tiny-llm import-hf``, the workflow's
``hf_checkpoints``), and a run's checkpoint written back as one (``tiny-llm export-hf``).

An import is all or nothing. Everything is read and checked before anything is written: each
directory's config.json (one model configuration), its weights (every tensor's name, shape,
dtype and finiteness against the model the configuration builds; the vocabulary against the
embedding), its tokenizer (the checkpoints of one suite share it; its vocabulary fits the
model's) and where it stands in training (steps strictly increasing; tokens given, read from a
Trainer's ``trainer_state.json`` or derived from the step, each saying which, or unknown). The run
is then written into a hidden temporary directory beside the run directory, whose first file is
the ``imported.json`` marker (so that nothing ever takes it for a run trained here), and renamed
into place only when complete. A kill at any point leaves either no run directory or a complete
import; the next import removes what the killed one left.

An imported run's ``resolved.yaml`` holds the model, the data section and the four training keys
that cut its analysis epoch (batch_size, micro_batch_size, tokens, epochs); the hyper-parameters
it was trained with elsewhere are unknown and are not written (``imported.json`` says so). When a
checkpoint carries a Trainer's ``trainer_state.json``, its logged training loss and gradient norms
become the run's ``train-log.jsonl`` (records marked ``source: trainer_state.json``), so that the
figures draw the training curve behind the measured losses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tiny_llm.config import RunConfig, config_from_dict, config_to_dict, load_config, resolved_dict
from tiny_llm.io import atomic_directory, atomic_write_json, local_directory, sha256_file
from tiny_llm.layout import IMPORTED, RESOLVED, TRAIN_LOG, epoch_file, moments_file
from tiny_llm.model.hf import (
    HF_CONFIG,
    from_hf_state,
    imported_config,
    read_json_object,
    read_weights,
    weight_files,
    write_hf_files,
)
from tiny_llm.model.hf_positions import (
    CheckpointPosition,
    CheckpointSource,
    as_written,
    checkpoint_positions,
    read_trainer_state,
    trainer_log,
    warn_unknown_tokens,
)
from tiny_llm.model.integrity import refuse_identical, state_findings

if TYPE_CHECKING:
    import torch

    from tiny_llm.model.moments import AdamMoments

__all__ = [
    "IMPORTED",
    "TOKENIZER_DIR",
    "CheckpointPosition",
    "checkpoint_positions",
    "checkpoint_tokenizer",
    "export_run",
    "import_run",
    "imported_record",
    "read_trainer_state",
    "run_tokenizer",
]

log = logging.getLogger("tiny_llm")

TOKENIZER_DIR = "tokenizer"
"""A run's copy of the tokenizer files its checkpoints came with (imported runs)."""
IMPORTED_TRAINING_KEYS = ("batch_size", "micro_batch_size", "tokens", "epochs")
"""The training keys an imported run's resolved.yaml holds: they cut the offset epoch it is measured on."""


def checkpoint_tokenizer(paths: list[Path], vocab_size: int) -> dict[str, Any] | None:
    """The tokenizer the checkpoint directories carry (their ``tokenizer.json``), as a token cache
    records it; None when none carries one.

    Raises:
        ValueError: directories with different tokenizers, an unreadable tokenizer.json, or a
            vocabulary larger than the model's.
    """
    from tiny_llm.data.corpus import read_tokenizer, tokenizer_files

    carrying = [Path(p) for p in paths if (Path(p) / "tokenizer.json").exists()]
    if not carrying:
        return None
    first = tokenizer_files(carrying[0]).get("tokenizer.json")  # what encodes; configs may differ in names
    for path in carrying[1:]:
        if tokenizer_files(path).get("tokenizer.json") != first:
            read_tokenizer(path)  # a corrupt one is named as such
            raise ValueError(
                f"{path} and {carrying[0]} carry different tokenizers; import the checkpoints of one "
                "model and tokenizer into one run directory"
            )
    if len(carrying) != len(paths):
        missing = next(str(p) for p in paths if Path(p) not in carrying)
        log.warning("%s carries no tokenizer; taking that of %s for every checkpoint", missing, carrying[0])
    _, record = read_tokenizer(carrying[0])
    if record["vocab_size"] > vocab_size:
        raise ValueError(
            f"{carrying[0] / 'tokenizer.json'}: its vocabulary ({record['vocab_size']} tokens) exceeds "
            f"the model's vocab_size {vocab_size}; these are not the model's tokenizer files"
        )
    return record


def _checked_states(paths: list[Path], planned: RunConfig) -> list[dict[str, torch.Tensor]]:
    """Every directory's weights under our keys, checked against the model ``planned`` builds
    (names, shapes, dtypes, finite values); nothing is written."""
    from tiny_llm.architectures import build_model
    from tiny_llm.model.checkpoint import check_state_dict

    model = build_model(planned.model)
    states = []
    for path in paths:
        if planned.model.architecture == "hf":
            state = _adapter_state(model, path)
        else:
            state = from_hf_state(read_weights(path), planned.model, str(path))
        embedding = state.get("tok_embeddings.weight")  # the adapter's mismatches: _adapter_state names them
        if embedding is not None and embedding.shape[0] != planned.model.vocab_size:
            raise ValueError(
                f"{path / 'config.json'}: vocab_size {planned.model.vocab_size} disagrees with the "
                f"embedding's {embedding.shape[0]} rows in the weights; the config.json does not belong "
                "to these weights"
            )
        check_state_dict(model, state, str(path))
        states.append(state)
    return states


def _adapter_state(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """The weights of a local directory under the adapter's keys (its module ``model.``), read by
    ``transformers`` itself (local files only; a ``.bin`` only once :func:`read_weights` has read it
    as plain tensors), so that the renames and conversions
    it applies to saved names (``embed_out`` to ``lm_head``, say) are the ones it computes with;
    tied tensors once, in the file's dtype."""
    import transformers

    read_weights(path)  # a truncated file, or a pickle carrying code, is refused by name here
    transformers.utils.logging.disable_progress_bar()  # a progress bar per checkpoint is noise in a log
    try:  # mismatches are reported below, by name, rather than in transformers' multi-line report
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
            path,
            local_files_only=True,
            use_safetensors=not any(name.endswith(".bin") for name in weight_files(path)),
            dtype="auto",
            ignore_mismatched_sizes=True,
            output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{path}: transformers cannot load these weights with their config.json ({first[:300]})"
        ) from None
    mismatched = sorted((key, tuple(saved), tuple(built)) for key, saved, built in info.get("mismatched_keys", ()))
    problems = [f"{key}: shape {saved} in the weights, {built} by config.json" for key, saved, built in mismatched]
    problems += [f"missing {sorted(info['missing_keys'])[:4]}"] if info.get("missing_keys") else []
    if problems:
        vocab = [p for p in problems if "embed" in p]
        hint = (
            " (config.json's vocab_size disagrees with the embedding: the config.json does not belong to these weights)"
            if vocab
            else ""
        )
        raise ValueError(f"{path}: weights do not match config.json{hint}: " + "; ".join(problems[:3]))
    shared = model.shared_keys()
    return {
        f"model.{key}": tensor.detach().clone()
        for key, tensor in loaded.state_dict().items()
        if f"model.{key}" not in shared
    }


def _resolved_text(config: RunConfig) -> str:
    """resolved.yaml of an imported run: the model and data sections and the training keys that cut
    its analysis epoch; what the run was trained with elsewhere is unknown and not written."""
    data = resolved_dict(config)
    data["training"] = {key: data["training"][key] for key in IMPORTED_TRAINING_KEYS}
    return (
        "# Imported (imported.json): trained elsewhere. Only the training keys that cut the analysis epoch\n"
        "# are recorded; its learning rate, optimizer and other hyper-parameters are unknown.\n"
        + yaml.safe_dump(data, sort_keys=False)
    )


def _leftovers(run_dir: Path) -> list[Path]:
    return sorted(run_dir.parent.glob(f".{run_dir.name}.import-*")) if run_dir.parent.is_dir() else []


def _check_target(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file; import into a new run directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        marker, resolved = run_dir / IMPORTED, run_dir / RESOLVED
        earlier = resolved.exists() and resolved.read_text(errors="replace").startswith("# Imported")
        what = (
            "holds an import already"
            if marker.exists()
            else "holds an earlier import whose imported.json is gone (the workflow removes it when the "
            "import's settings change; remove the directory to import again)"
            if earlier
            else "holds a run trained here"
            if resolved.exists()
            else "is not empty (it holds no run: a half-made import of an earlier version? remove it)"
        )
        raise ValueError(f"{run_dir} {what}; import into a new run directory")


def import_run(
    sources: list[CheckpointSource],
    run_dir: str | Path,
    config: RunConfig,
    tokens_per_step: int | None = None,
    adapter: bool = False,
    allow_identical: bool = False,
) -> Path:
    """Make a run directory from local Hugging Face checkpoint directories of one model (the
    revisions of a training suite, oldest first, or just one; each with what is stated of it):
    ``resolved.yaml`` (the model section from their config.json; data and the analysis epoch's
    training keys from ``config``), each checkpoint's weights as ``epoch-NNN.safetensors`` in the
    order given (as stored; metadata: its step, tokens and source directory), the tokenizer they
    carry (``tokenizer/``) and ``imported.json`` (each checkpoint's source, hub revision, step and
    tokens with where each came from, stored dtypes, file hashes, its distance from the first
    checkpoint and what the integrity checks found: :mod:`tiny_llm.model.integrity`). Checkpoints
    of different steps with identical weights are refused unless ``allow_identical``.
    The Llama family, GPT-2 and GPT-NeoX become our models (every engine); another architecture
    (or any, with ``adapter``) keeps its own weights and config.json (``hf-config.json``) for the
    adapter (HVP engines). All or nothing (see the module docstring); ``run_dir`` must not exist or
    be empty.

    Raises:
        ValueError: anything :func:`read_hf`, :func:`checkpoint_positions` or
            :func:`checkpoint_tokenizer` refuses, weights that do not match their config.json,
            or a ``run_dir`` that holds something.
    """
    try:
        return _import_run(sources, Path(run_dir), config, tokens_per_step, adapter, allow_identical)
    except ValueError as error:  # a hub revision named as its user wrote it, not by its snapshot's hash
        raise ValueError(as_written(str(error), sources)) from None


def _import_run(
    sources: list[CheckpointSource],
    run_dir: Path,
    config: RunConfig,
    tokens_per_step: int | None,
    adapter: bool,
    allow_identical: bool,
) -> Path:
    """:func:`import_run`'s work."""
    paths = [s.path for s in sources]
    _check_target(run_dir)
    for path in paths:
        local_directory(path, "checkpoint directory")
    planned = imported_config(paths, config, adapter=adapter)  # checkpoints of different models first
    positions = checkpoint_positions(sources, tokens_per_step)
    training_log = trainer_log(paths, tokens_per_step)
    tokenizer = checkpoint_tokenizer(paths, planned.model.vocab_size)
    states = _checked_states(paths, planned)
    from tiny_llm.model.hf_optimizer import suite_moments  # torch: not on the command line's import path

    moments = suite_moments(paths, planned.model, [p.step for p in positions])
    labels = [s.revision or s.path.name for s in sources]
    findings, distances = state_findings(labels, [p.step for p in positions], states)
    if not allow_identical:
        refuse_identical(findings, "import", "--allow-identical-states (allow_identical_states: true)")
    warn_unknown_tokens(paths, positions)  # after every refusal: a refused import prints one line
    for label, found in findings.items():
        log.warning("integrity: %s: %s", label, "; ".join(f["detail"] for f in found))
    for stale in _leftovers(run_dir):
        log.info("removing %s, left by an interrupted import", stale)
        shutil.rmtree(stale, ignore_errors=True)
    with atomic_directory(run_dir, kind="import") as tmp:  # renamed onto a missing or empty directory only
        suite = _Suite(sources, positions, states, [findings.get(label, []) for label in labels], distances, moments)
        _write_import(tmp, run_dir, planned, suite, tokenizer, training_log)
    log.info("imported %d checkpoint(s) into %s", len(paths), run_dir)
    return run_dir


@dataclasses.dataclass(frozen=True)
class _Suite:
    """What an import writes of each checkpoint, in the suite's order."""

    sources: list[CheckpointSource]
    positions: list[CheckpointPosition]
    states: list[dict[str, torch.Tensor]]
    findings: list[list[dict[str, Any]]]
    """What the integrity checks found of each (empty: nothing)."""
    distances: list[float]
    """‖θᵢ − θ₀‖ of each from the first."""
    moments: list[AdamMoments | None]
    """Each one's Adam moments from its optimizer.pt (None: none, or an adapter's model)."""


def _write_checkpoint(tmp: Path, index: int, suite: _Suite) -> dict[str, Any]:
    """One imported checkpoint as ``epoch-<index>.safetensors`` in ``tmp``, and its record (where it
    came from, its step and tokens, the dtypes its weights were stored in, the sha256 of its
    directory's files)."""
    from tiny_llm.model.checkpoint import save_weights

    source, position, state = suite.sources[index], suite.positions[index], suite.states[index]
    path, name = source.path, epoch_file(index)
    metadata = {
        "step": position.step,
        "epoch": 0,
        "source": source.revision or path.name,  # what the tables name it by
        **({"tokens": position.tokens} if position.tokens is not None else {}),
    }
    save_weights(tmp / name, state, metadata)
    if suite.moments[index] is not None:
        from tiny_llm.model.moments import save_moments

        save_moments(tmp / moments_file(name), suite.moments[index])
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin"))
    return {
        "checkpoint": name,
        **source.record(),
        **position.record(),
        "stored_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}),
        "files": {p.name: sha256_file(p) for p in files},
        "distance_from_first": suite.distances[index],
        "optimizer": None
        if suite.moments[index] is None
        else {"moments": moments_file(name), **suite.moments[index].record()},
        "integrity": suite.findings[index],
    }


def _write_import(
    tmp: Path,
    run_dir: Path,
    planned: RunConfig,
    suite: _Suite,
    tokenizer: dict[str, Any] | None,
    training_log: tuple[Path, list[dict[str, Any]]] | None,
) -> None:
    """The import's files in ``tmp`` (renamed onto ``run_dir`` by the caller): the marker first,
    the full record last."""
    paths = [s.path for s in suite.sources]
    record: dict[str, Any] = {"complete": False, "architecture": planned.model.architecture}
    atomic_write_json(tmp / IMPORTED, record)  # first: this directory is never a run trained here
    model = planned.model
    if model.architecture == "hf":  # the run's own copy of the config.json
        (tmp / HF_CONFIG).write_text((paths[0] / "config.json").read_text())
        model = dataclasses.replace(model, hf_config=str(run_dir / HF_CONFIG))
    if tokenizer is not None:
        (tmp / TOKENIZER_DIR).mkdir()
        for name in tokenizer["files"]:
            shutil.copyfile(Path(tokenizer["path"]) / name, tmp / TOKENIZER_DIR / name)
        tokenizer = {**tokenizer, "path": str((run_dir / TOKENIZER_DIR).resolve()), "name": paths[0].name}
    checkpoints = [_write_checkpoint(tmp, index, suite) for index in range(len(suite.sources))]
    resolved = config_from_dict({**config_to_dict(planned), "model": config_to_dict(model)})
    (tmp / RESOLVED).write_text(_resolved_text(resolved))
    if training_log is not None:  # the Trainer's logged losses and norms, for the figures
        (tmp / TRAIN_LOG).write_text("".join(json.dumps(r) + "\n" for r in training_log[1]))
    record.update(
        {
            "complete": True,
            "checkpoints": checkpoints,
            "tokenizer": tokenizer,
            "training_log": None
            if training_log is None
            else {"source": str(training_log[0].resolve()), "records": len(training_log[1])},
            "training": "trained elsewhere: hyper-parameters unknown; resolved.yaml holds only "
            + ", ".join(IMPORTED_TRAINING_KEYS),
        }
    )
    atomic_write_json(tmp / IMPORTED, record)


def imported_record(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's ``imported.json``, or None for a run trained here.

    Raises:
        ValueError: an unreadable or incomplete record (an import that did not finish).
    """
    path = Path(run_dir) / IMPORTED
    if not path.exists():
        return None
    record = read_json_object(path)
    if record.get("complete") is False:
        raise ValueError(f"{path}: the import did not finish; import again into a new run directory")
    return record


def run_tokenizer(run_dir: str | Path) -> dict[str, Any] | None:
    """The tokenizer a run's checkpoints came with (imported runs), as a cache records it; None
    when unknown (trained here: its cache's, or imported without one)."""
    record = imported_record(run_dir)
    return None if record is None else record.get("tokenizer")


def export_run(run_dir: str | Path, checkpoint: str, out: str | Path) -> Path:
    """Write a run's checkpoint (``epoch-NNN.safetensors`` or ``final.pt``) as a Hugging Face
    directory of its architecture, in the checkpoint's dtype, with the tokenizer its token cache
    was encoded with (an imported run: the one it came with; a byte-level cache: a byte-level
    tokenizer whose ids are the byte values) so that transformers can generate text with it.

    Raises:
        ValueError: an unreadable or mismatched checkpoint, or ``out`` exists.
    """
    from tiny_llm.architectures import build_model
    from tiny_llm.data.corpus import write_hf_tokenizer
    from tiny_llm.model.checkpoint import check_state_dict, load_weights

    run_dir, out = Path(run_dir), Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; choose a new directory (nothing is overwritten)")
    config = load_config(run_dir / RESOLVED)
    state, _ = load_weights(run_dir / checkpoint)
    check_state_dict(build_model(config.model), state, str(run_dir / checkpoint))
    tokenizer = run_tokenizer(run_dir)
    if tokenizer is not None:  # the run's own copy, wherever the project has moved since
        tokenizer = {**tokenizer, "path": str(run_dir / TOKENIZER_DIR)}
    tokenizer = tokenizer or _cache_tokenizer(config)
    with atomic_directory(out) as tmp:
        if config.model.architecture != "hf":
            write_hf_files(tmp, config.model, state)
        else:  # another architecture: its own config.json and tensor names, as imported
            from safetensors.torch import save_file

            save_file(
                {k.removeprefix("model."): t.contiguous() for k, t in state.items()},
                str(tmp / "model.safetensors"),
                metadata={"format": "pt"},
            )
            (tmp / "config.json").write_text(Path(config.model.hf_config).read_text())
        written = write_hf_tokenizer(tmp, tokenizer, config.model.vocab_size)
    if not written:
        log.warning(
            "%s: no tokenizer written (the run's cache records none that can be written: %s); give the "
            "export the tokenizer its cache was encoded with",
            out,
            (tokenizer or {}).get("type", "unknown"),
        )
    return out


def _cache_tokenizer(config: RunConfig) -> dict[str, Any] | None:
    """The tokenizer record of the run's token cache (meta.json), or None when it cannot be read."""
    meta = Path(config.data.cache) / "meta.json"
    try:
        return json.loads(meta.read_text()).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None
