"""The ``tiny-llm`` command line: prepare-data, train, analyze-state, analyze-spectrum, plot-analysis,
summarize, import-hf, export-hf.

The parser needs no torch: each command imports what it runs when it runs (``--help`` stays fast),
and the analysis options take their defaults and choices from the torch-free settings classes and
the engine registry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

import tiny_llm.commands as commands
from tiny_llm.declared import add_options
from tiny_llm.runtime import keep_freed_memory
from tiny_llm.workers.settings import CASES, AnalysisSettings, SpectrumSettings

log = logging.getLogger("tiny_llm")


def _samples(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return value


def _audit(text: str) -> bool | str:
    """auto, or a switch (on or true, off or false): ``--audit`` and ``--preconditioned``."""
    words = {"auto": "auto", "on": True, "true": True, "off": False, "false": False}
    if text not in words:
        raise argparse.ArgumentTypeError(f"expected auto, on (true) or off (false), got {text!r}")
    return words[text]


def _command(sub: argparse._SubParsersAction, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """The subcommand ``name``: ``summary`` in the command list, ``description`` atop its help."""
    return sub.add_parser(name, formatter_class=_HelpFormatter, help=summary, description=description)


def _add_state_arguments(an: argparse.ArgumentParser) -> None:
    """Inputs and numerical settings shared by the analysis workers: one option per field of
    ``AnalysisSettings`` (its default, choices and docstring)."""
    _add_inputs(an)
    add_options(an, AnalysisSettings, parsers={"noise_samples": _samples, "audit": _audit, "preconditioned": _audit})


def _add_inputs(an: argparse.ArgumentParser) -> None:
    """The run, its checkpoints, the case and the output."""
    an.add_argument("--run", required=True, type=Path, help="run directory (holds resolved.yaml)")
    an.add_argument(
        "--checkpoint",
        required=True,
        action="append",
        help="root checkpoint, relative to the run directory or absolute (repeat for aliases)",
    )
    an.add_argument(
        "--case",
        required=True,
        choices=CASES,
        help="seen: epoch 1 as trained; unseen: one epoch after training's final shuffle group; offset: "
        "one batch-aligned epoch of the cache from --data-offset (imported runs: the only case); step: the "
        "batches training took from this checkpoint towards --successor (at most an epoch; without one, unseen's)",
    )
    an.add_argument("--output", required=True, type=Path, help="result JSON to write")
    an.add_argument("--expect-key", help="refuse unless the checkpoints hash to this state key")
    an.add_argument(
        "--successor",
        help="the next checkpoint of the run, relative to it or absolute: adds the statistics along the step "
        "Δ = θ' − θ training took to it (analyze-state) and Δ's share in the top eigenspace (analyze-spectrum)",
    )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "default" in (action.help or "") or action.default in (None, False, [], "", argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)


def _add_config(p: argparse.ArgumentParser) -> None:
    """--config and --set, for the commands that read a run configuration."""
    p.add_argument("--config", type=Path, help="run configuration YAML (sections model, data, training)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration key, e.g. training.lr=0.001 (repeatable)",
    )


def _add_prepare_data(sub: argparse._SubParsersAction) -> None:
    prep = _command(
        sub,
        "prepare-data",
        "build a token cache (meta.json + shards)",
        "Tokenize a corpus (the built-in demo text, UTF-8 files or token arrays) into "
        "a token cache: shards of uint16/uint32 ids and meta.json with their sha256, written "
        "atomically; an existing cache with the same settings is reused. The sequences of all "
        "inputs are shuffled with data.seed unless --keep-order.",
    )
    _add_config(prep)
    prep.add_argument("--out", help="cache directory (default: data.cache of the configuration)")
    prep.add_argument(
        "--source",
        choices=["demo", "text", "tokens"],
        default="demo",
        help="demo: built-in synthetic corpus; text: UTF-8 files; tokens: .npy or raw .bin arrays",
    )
    prep.add_argument("inputs", nargs="*", type=Path, help="input files for --source text|tokens")
    prep.add_argument("--demo-seed", type=int, default=0, help="seed of the demo corpus generator")
    prep.add_argument("--shard-tokens", type=int, default=1 << 20, help="approximate tokens per shard")
    prep.add_argument(
        "--keep-order",
        action="store_true",
        help="keep the sources' order (default: shuffle all sequences of all inputs with data.seed, "
        "so that every batch spans the corpus)",
    )
    prep.add_argument(
        "--token-dtype",
        default="uint16",
        choices=["uint16", "uint32", "int32", "int64"],
        help="element type of raw .bin token files",
    )
    prep.add_argument("--vocab-size", type=int, default=256, help="vocabulary size of --source tokens")
    prep.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="--source text: encode with the Hugging Face tokenizer in "
        "this local directory (its tokenizer.json) instead of bytes; recorded in meta.json, and "
        "model.vocab_size must cover its vocabulary",
    )
    prep.add_argument("--tokenizer-description", default="", help="recorded in meta.json for --source tokens")
    prep.set_defaults(func=commands.prepare_data)


def _add_train(sub: argparse._SubParsersAction) -> None:
    tr = _command(
        sub,
        "train",
        "train a run (rerun the same command to resume)",
        "Train a run into its run directory (resolved.yaml, epoch-NNN.safetensors, "
        "final.pt, train-log.jsonl); the same command resumes an interrupted run, and does "
        "nothing for a finished one.",
    )
    _add_config(tr)
    tr.add_argument("--run-dir", required=True, help="run directory, e.g. runs/demo")
    tr.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    tr.add_argument("--stop-after-epoch", type=int, help="stop at this virtual epoch (resume later)")
    tr.set_defaults(func=commands.train)


def _add_analyze_state(sub: argparse._SubParsersAction) -> None:
    an = _command(
        sub,
        "analyze-state",
        "gradient noise and curvature of one state on one data case",
        "Measure one parameter state (one or more alias checkpoints) on one data "
        "case and write one result JSON atomically; progress on stderr.",
    )
    _add_state_arguments(an)
    an.set_defaults(func=commands.analyze_state)


def _add_analyze_spectrum(sub: argparse._SubParsersAction) -> None:
    sp = _command(
        sub,
        "analyze-spectrum",
        "Hessian spectrum of one state on one data case",
        "Lanczos top eigenpairs with residuals, SLQ density nodes, gradient/noise "
        "alignment with the top eigenvectors, a damped CG solve and block-diagonal errors; "
        "one result JSON, written atomically.",
    )
    _add_state_arguments(sp)
    add_options(sp, SpectrumSettings, skip=("sharded",))  # sharded: the analysis option shards both
    sp.set_defaults(func=commands.analyze_spectrum)


def _add_plot_analysis(sub: argparse._SubParsersAction) -> None:
    pl = _command(
        sub,
        "plot-analysis",
        "redraw an analysis's figures from its saved results",
        "Redraw the figures of an analysis directory from its summary.csv and "
        "manifest.json, without computing anything.",
    )
    pl.add_argument("--output", required=True, type=Path, help="analysis directory (holds summary.csv)")
    pl.add_argument("--training-norms", action="store_true", help="add the logged pre-clipping training norms")
    pl.add_argument(
        "--x-axis",
        choices=["auto", "tokens", "step"],
        default="auto",
        help="training tokens or steps on the x-axis (auto: tokens when every checkpoint's are known)",
    )
    pl.set_defaults(func=commands.plot_analysis)


def _add_import_positions(ih: argparse.ArgumentParser) -> None:
    """``import-hf``'s steps and tokens of the checkpoints, where they are stated."""
    ih.add_argument(
        "--step",
        type=int,
        nargs="+",
        help="training step of each directory's weights (recorded; "
        "default: a Trainer's trainer_state.json global_step there; one directory without either: 0, "
        "recorded as unknown); steps must increase in the order given",
    )
    ih.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        help="training tokens of each directory's weights (recorded; "
        "the figures' x-axis; default: trainer_state.json num_input_tokens_seen, else step x "
        "--tokens-per-step, else unknown (a warning; the figures then use steps)",
    )
    ih.add_argument(
        "--tokens-per-step",
        type=int,
        help="training tokens per optimizer step (batch size x sequence "
        "length x gradient accumulation x devices), for tokens derived from the step",
    )


def _add_import_hf(sub: argparse._SubParsersAction) -> None:
    ih = _command(
        sub,
        "import-hf",
        "make a run directory from local Hugging Face checkpoint directories or cached revisions",
        "Read local Hugging Face causal-LM directories, or a repository's revisions in the "
        "local Hugging Face cache (config.json and safetensors, or pytorch_model.bin read as tensors "
        "only; no download), the checkpoints of one model, into a new run directory: "
        "resolved.yaml (model from config.json, data and training from --config), "
        "epoch-000.safetensors, epoch-001.safetensors, ... in the order given (oldest first; each "
        "records its source directory, step and tokens), the tokenizer they carry and imported.json; "
        "written whole or not at all. "
        "Llama-family (Llama, Mistral, Qwen2), GPT-2 and GPT-NeoX (Pythia) checkpoints become this "
        "project's models (every engine); a configuration they cannot represent is refused by name. "
        "Any other architecture (or any, with --adapter) keeps its weights and config.json "
        "(hf-config.json) and is measured through an adapter with the HVP engines. "
        "Seen and unseen do not apply to an imported run: analyse it on the offset case (a "
        "batch-aligned epoch of the cache from a stated offset).",
    )
    ih.add_argument(
        "directories",
        nargs="+",
        type=Path,
        help="local Hugging Face model directories, oldest first; or one repository ORG/NAME with --revision",
    )
    ih.add_argument(
        "--revision",
        nargs="+",
        help="revisions of the repository (step1000 ...), oldest first, resolved in the local Hugging Face "
        "cache (HF_HUB_CACHE, or HF_HOME/hub), never downloaded; a revision's name gives its step "
        "(stepN) unless stated; a name's rounded tokens (...-tokens4B) only check --tokens-per-step",
    )
    ih.add_argument("--run-dir", required=True, type=Path, help="new run directory, e.g. runs/imported")
    _add_config(ih)
    _add_import_positions(ih)
    ih.add_argument(
        "--adapter",
        action="store_true",
        help="keep transformers' own model even for a natively read architecture (measured with the "
        "HVP engines; to compare the two, or for a configuration transformers computes differently)",
    )
    ih.add_argument(
        "--allow-identical-states",
        action="store_true",
        help="import checkpoints of different steps whose weights are identical (refused otherwise: a suite "
        "that serves one checkpoint under several steps' names); they are measured once, and reported",
    )
    ih.set_defaults(func=commands.import_hf)


def _add_export_hf(sub: argparse._SubParsersAction) -> None:
    eh = _command(
        sub,
        "export-hf",
        "write a run's checkpoint as a Hugging Face model directory",
        "Write one checkpoint of a run as a Hugging Face directory of its architecture "
        "(LlamaForCausalLM, GPT2LMHeadModel, or an imported model's own; config.json, "
        "model.safetensors) that transformers opens with from_pretrained; the directory must not "
        "exist yet.",
    )
    eh.add_argument("--run", required=True, type=Path, help="run directory (holds resolved.yaml)")
    eh.add_argument("--checkpoint", required=True, help="epoch-NNN.safetensors or final.pt, relative to the run")
    eh.add_argument("--out", required=True, type=Path, help="new output directory")
    eh.set_defaults(func=commands.export_hf)


def _add_summarize(sub: argparse._SubParsersAction) -> None:
    sm = _command(
        sub,
        "summarize",
        "print an analysis's summary table with standard errors and flags",
        "Print the summary table of a collected analysis (results/<name>) in the "
        "terminal: each checkpoint and case with its statistics ± one standard error, then "
        "plain-language flags (B_noise above the training batch, curvature within one standard "
        "error of 0, precision audit over its threshold, unconverged eigenvalues, data order).",
    )
    sm.add_argument("analysis", type=Path, help="analysis directory, e.g. results/demo")
    sm.set_defaults(func=commands.summarize)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cm = _command(
        sub,
        "compare",
        "compare seed experiments in one figure (from their comparison.csv)",
        "Draw the mean over seeds (or seed pairs) of selected metrics for several "
        "seed experiments, from each experiment's comparison.csv, without computing anything.",
    )
    cm.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        type=Path,
        help="experiment directories (results/<experiment>, each with comparison.csv)",
    )
    cm.add_argument("--labels", nargs="+", help="a label per input (default: the directory names)")
    cm.add_argument("--metrics", nargs="+", help="metrics to draw (default: every metric present)")
    cm.add_argument("--output", required=True, type=Path, help="folder for comparison.pdf and comparison.png")
    cm.set_defaults(func=commands.compare)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiny-llm",
        formatter_class=_HelpFormatter,
        description="Token caches, training runs, and the gradient-noise and curvature analysis of their checkpoints.",
    )
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show the Python traceback (for bug reports; also TINY_LLM_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    for add in (
        _add_prepare_data,
        _add_train,
        _add_analyze_state,
        _add_analyze_spectrum,
        _add_plot_analysis,
        _add_import_hf,
        _add_export_hf,
        _add_summarize,
        _add_compare,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tiny-llm`` console script."""
    args = _parser().parse_args(argv)
    keep_freed_memory()
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input or an unwritable path: one line, exit status 2
        if args.debug or os.environ.get("TINY_LLM_DEBUG") == "1":
            raise
        from tiny_llm.distributed import rank_note

        line = f"tiny-llm {args.command}: error{rank_note()}: {' '.join(str(error).split())}"
        sys.stderr.flush()
        sys.stderr.write(line + "\n")  # one write: the ranks' lines never run together
        sys.stderr.flush()
        _tell_torchrun(line)
        return 2
    return 0


def _tell_torchrun(line: str) -> None:
    """Under torchrun, the refusal also goes to the rank's error file, so that torchrun's failure
    report, the last thing it prints, shows this one line in place of its "To enable traceback"."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))


if __name__ == "__main__":
    sys.exit(main())
