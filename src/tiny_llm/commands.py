"""What each ``tiny-llm`` command runs, given its parsed options (:mod:`tiny_llm.cli` builds the
parser): each imports what it runs when it runs, so that ``--help`` needs no torch. A bad input
raises ``ValueError`` naming the file or key; the command line prints it as one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from tiny_llm.config import RunConfig, apply_overrides, config_from_dict, load_config_dict
from tiny_llm.declared import from_options
from tiny_llm.layout import RESOLVED
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

__all__ = [
    "analyze_spectrum",
    "analyze_state",
    "compare",
    "export_hf",
    "import_hf",
    "plot_analysis",
    "prepare_data",
    "summarize",
    "train",
]

log = logging.getLogger("tiny_llm")


def _config(args: argparse.Namespace, fallback: Path | None = None) -> RunConfig:
    """The run configuration from --config (or ``fallback``) plus --set overrides."""
    path = args.config or fallback
    data = load_config_dict(path) if path else {}
    try:
        return config_from_dict(apply_overrides(data, args.set))
    except ValueError as error:
        raise ValueError(f"{path or 'default configuration'}: {error}") from None


def prepare_data(args: argparse.Namespace) -> None:
    """``tiny-llm prepare-data``."""
    from tiny_llm.data.corpus import Source, default_capacity, prepare_source_cache

    config = _config(args)
    if args.tokenizer is not None:
        _check_tokenizer_fits(args)
    # Demo: what this run plus one unseen epoch need; files: every whole group, unless set.
    capacity = default_capacity(config) if args.source == "demo" else config.data.prepare_train_tokens
    out = prepare_source_cache(
        config.data,
        Source(
            args.source,
            tuple(args.inputs or ()),
            demo_seed=args.demo_seed,
            tokenizer_dir=args.tokenizer,
            token_dtype=args.token_dtype,
            vocab_size=args.vocab_size,
            tokenizer_description=args.tokenizer_description,
        ),
        capacity=capacity,
        out=args.out,
        shard_tokens=args.shard_tokens,
        keep_order=args.keep_order,
    )
    log.info("token cache ready: %s", out)


def _check_tokenizer_fits(args: argparse.Namespace) -> None:
    """A tokenizer whose vocabulary exceeds the model's is refused before anything is encoded: the
    model.vocab_size the configuration sets, and the config.json of a model directory given as
    the tokenizer."""
    from tiny_llm.data.corpus import read_tokenizer
    from tiny_llm.model.hf import read_json_object

    _, record = read_tokenizer(args.tokenizer)
    data = apply_overrides(load_config_dict(args.config) if args.config else {}, args.set)
    limits = []
    if isinstance(data.get("model"), dict) and "vocab_size" in data["model"]:
        limits.append((data["model"]["vocab_size"], f"model.vocab_size of {args.config or '--set'}"))
    if (Path(args.tokenizer) / "config.json").is_file():
        hf = read_json_object(Path(args.tokenizer) / "config.json")
        if isinstance(hf.get("vocab_size"), int):
            limits.append((hf["vocab_size"], f"vocab_size of {Path(args.tokenizer) / 'config.json'}"))
    for limit, where in limits:
        if record["vocab_size"] > limit:
            raise ValueError(
                f"--tokenizer {args.tokenizer}: its vocabulary ({record['vocab_size']} tokens) exceeds the "
                f"{where} ({limit}); the model could not read its ids. Use the model's own tokenizer or "
                "raise vocab_size"
            )


def train(args: argparse.Namespace) -> None:
    """``tiny-llm train``."""
    from tiny_llm.training.loop import train

    run_dir = Path(args.run_dir)
    resolved = run_dir / RESOLVED
    config = _config(args, fallback=resolved if resolved.exists() else None)
    final = train(config, run_dir, device=args.device, stop_after_epoch=args.stop_after_epoch)
    print(final)


def import_hf(args: argparse.Namespace) -> None:
    """``tiny-llm import-hf``."""
    from tiny_llm.model.hf_runs import import_run

    sources, config = _import_sources(args), _config(args)
    print(import_run(sources, args.run_dir, config, args.tokens_per_step, args.adapter, args.allow_identical_states))


def _import_sources(args: argparse.Namespace) -> list:
    """The checkpoints ``import-hf`` was given: local directories, or a repository's revisions in
    the local Hugging Face cache (``ORG/NAME --revision R1 R2 ...``), with the steps and tokens
    stated for each."""
    from tiny_llm.model.hf_positions import CheckpointSource
    from tiny_llm.model.hub import resolve_revision

    if args.revision:
        if len(args.directories) != 1:
            raise ValueError(f"--revision takes one repository (ORG/NAME), got {len(args.directories)}")
        repo = str(args.directories[0])
        found = [(resolve_revision(repo, r), repo, r) for r in args.revision]
    else:
        found = [(Path(d), None, None) for d in args.directories]
    n = len(found)
    for flag, values in (("--step", args.step), ("--tokens", args.tokens)):
        if values is not None and len(values) != n:
            raise ValueError(f"{flag}: give one per checkpoint ({n} checkpoints, {len(values)} given)")
    steps, tokens = args.step or [None] * n, args.tokens or [None] * n
    return [
        CheckpointSource(path, step, count, repo, revision)
        for (path, repo, revision), step, count in zip(found, steps, tokens, strict=True)
    ]


def export_hf(args: argparse.Namespace) -> None:
    """``tiny-llm export-hf``."""
    from tiny_llm.model.hf_runs import export_run

    print(export_run(args.run, args.checkpoint, args.out))


def analyze_state(args: argparse.Namespace) -> None:
    """``tiny-llm analyze-state``."""
    from tiny_llm.distributed import init_from_environment, say
    from tiny_llm.workers.state import analyze_state

    init_from_environment(args.device)  # under torchrun: one rank of the data-parallel passes
    result = analyze_state(
        args.run,
        args.checkpoint,
        args.case,
        _analysis_settings(args),
        args.output,
        expect_key=args.expect_key,
        successor=_successor(args),
    )
    say(json.dumps(result["statistics"], indent=1))


def summarize(args: argparse.Namespace) -> None:
    """``tiny-llm summarize``."""
    from tiny_llm.results.summarize import summarize

    print(summarize(args.analysis))


def plot_analysis(args: argparse.Namespace) -> None:
    """``tiny-llm plot-analysis``."""
    from tiny_llm.results.figures import plot_analysis

    for path in plot_analysis(args.output, training_norms=args.training_norms, x_axis=args.x_axis):
        print(path)


def _successor(args: argparse.Namespace) -> dict[str, Any] | None:
    """The next state named by ``--successor``, as the workflow names it (its checkpoint file and
    the step its metadata records: where the ``step`` case's batches end)."""
    if args.successor is None:
        return None
    from tiny_llm.model.checkpoint import load_weights
    from tiny_llm.workers.selection import resolve_checkpoints

    step = load_weights(resolve_checkpoints(Path(args.run), [args.successor])[0])[1].get("step")
    return {"file": args.successor, **({"step": int(step)} if str(step).isdigit() else {})}


def _analysis_settings(args: argparse.Namespace) -> AnalysisSettings:
    """The analysis settings the command line's options parsed to (one option per field)."""
    return from_options(AnalysisSettings, args)


def analyze_spectrum(args: argparse.Namespace) -> None:
    """``tiny-llm analyze-spectrum``."""
    from tiny_llm.distributed import init_from_environment, say
    from tiny_llm.workers.spectrum import analyze_spectrum

    init_from_environment(args.device)  # under torchrun: one rank of the data-parallel passes
    spectrum = from_options(SpectrumSettings, args)  # sharded: the analysis option shards both
    result = analyze_spectrum(
        args.run,
        args.checkpoint,
        args.case,
        _analysis_settings(args),
        spectrum,
        args.output,
        expect_key=args.expect_key,
        successor=_successor(args),
    )
    say(json.dumps({"top_eigenvalues": result["top_eigenvalues"], "cg": result["cg"]}, indent=1))


def compare(args: argparse.Namespace) -> None:
    """``tiny-llm compare``."""
    from tiny_llm.geometry.figures import compare_experiments

    tables = [path / "comparison.csv" for path in args.inputs]
    missing = [str(path) for path in tables if not path.exists()]
    if missing:
        raise ValueError(f"no comparison.csv in {', '.join(missing)}; run the experiments first (snakemake -c1 seeds)")
    compare_experiments(
        tables,
        args.labels or [path.name for path in args.inputs],
        args.metrics,
        [args.output / "comparison.pdf", args.output / "comparison.png"],
    )
    print(f"wrote {args.output / 'comparison.pdf'} and {args.output / 'comparison.png'}")
