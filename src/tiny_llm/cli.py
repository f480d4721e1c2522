"""The ``tiny-llm`` command line: prepare-data, train, analyze-state, analyze-spectrum, plot-analysis,
summarize, import-hf, export-hf.

The parser needs no torch: each command imports what it runs when it runs (``--help`` stays fast),
and the analysis options take their defaults and choices from the torch-free settings classes and
the engine registry.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

import tiny_llm.commands as commands
from tiny_llm.runtime import keep_freed_memory
from tiny_llm.workers.settings import CASES, ENGINE_SETTINGS, LANCZOS_BASES, AnalysisSettings, SpectrumSettings

log = logging.getLogger("tiny_llm")

ANALYSIS = {f.name: f.default for f in dataclasses.fields(AnalysisSettings)}
"""AnalysisSettings' defaults: the options of the analysis commands show and use them."""
SPECTRUM = {f.name: f.default for f in dataclasses.fields(SpectrumSettings)}
"""SpectrumSettings' defaults."""


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


def _add_state_arguments(an: argparse.ArgumentParser) -> None:
    """Inputs and numerical settings shared by the analysis workers."""
    _add_inputs(an)
    _add_sampling(an)
    _add_precision(an)
    _add_audit_and_memory(an)


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
        "one batch-aligned epoch of the cache from --data-offset (imported runs: the only case)",
    )
    an.add_argument(
        "--data-offset",
        type=int,
        default=ANALYSIS["data_offset"],
        help="case offset: batches (of training.batch_size sequences) into the cache where the epoch "
        "starts (default 0)",
    )
    an.add_argument("--output", required=True, type=Path, help="result JSON to write")
    an.add_argument("--expect-key", help="refuse unless the checkpoints hash to this state key")


def _add_sampling(an: argparse.ArgumentParser) -> None:
    """How many directions, drawn how, measured by which engine."""
    an.add_argument(
        "--noise-samples", type=_samples, default=ANALYSIS["noise_samples"], help="S_v sampled batches, or 'all'"
    )
    an.add_argument("--random-samples", type=int, default=ANALYSIS["random_samples"], help="S_r Rademacher directions")
    an.add_argument("--seed", type=int, default=ANALYSIS["seed"], help="seed of batch draws and directions")
    an.add_argument("--hvp-batch-size", type=int, help="curvature micro-batch (default: training micro-batch)")
    an.add_argument(
        "--directions-per-pass", type=int, default=ANALYSIS["directions_per_pass"], help="K directions per data pass"
    )
    an.add_argument(
        "--engine",
        default=ANALYSIS["engine"],
        choices=ENGINE_SETTINGS,
        help="engine of the quadratic forms vᵀHv: taylor, adjoint (no Hessian-vector products) or an HVP "
        "engine (auto: adjoint, or taylor with --directions-per-pass 1); spectra use an HVP engine",
    )
    an.add_argument(
        "--no-compile-hvp",
        action="store_true",
        help="no torch.compile of Pearlmutter HVPs on CUDA (spectra then use double_backward)",
    )
    an.add_argument(
        "--block-curvature",
        action="store_true",
        help="also each parameter block's block-diagonal noise and gradient forms (B_noise per block; "
        "one more form per noise sample and block)",
    )
    an.add_argument(
        "--sharded",
        action="store_true",
        help="under torchrun: shard the model and every parameter-sized vector over the ranks (FSDP2); "
        "forms by the Taylor mode block by block (engine auto or taylor) or finite differences, "
        "spectra's products by finite differences; the precision audit sharded too",
    )


def _add_precision(an: argparse.ArgumentParser) -> None:
    """Device and numerical precision; packed runs' consensus."""
    an.add_argument("--device", default=ANALYSIS["device"], help="cpu, cuda, cuda:N or auto (cuda when available)")
    an.add_argument("--dtype", default=ANALYSIS["dtype"], choices=["float32", "float64"], help="parameter dtype")
    an.add_argument("--no-tf32", action="store_true", help="IEEE float32 matmuls on CUDA")
    an.add_argument("--amp", action="store_true", help="bf16 autocast in the forward (requires float32)")
    an.add_argument("--no-consensus", action="store_true", help="packed runs: skip consensus errors")


def _add_audit_and_memory(an: argparse.ArgumentParser) -> None:
    """The precision audit and the memory budget."""
    an.add_argument(
        "--audit",
        choices=["auto", "on", "off", "true", "false"],
        default=ANALYSIS["audit"],
        help="precision audit in float64: on (true), off (false) or auto (on unless the analysis runs in "
        "float64 without --amp)",
    )
    an.add_argument(
        "--audit-directions",
        type=int,
        default=ANALYSIS["audit_directions"],
        help="audited noise and random directions (each; ḡ is always audited)",
    )
    an.add_argument(
        "--audit-batches",
        type=int,
        default=ANALYSIS["audit_batches"],
        help="curvature micro-batches the audit measures",
    )
    an.add_argument(
        "--memory-budget-gb",
        type=float,
        help="GiB a job may use on its device; passes are cut into groups of sequences to fit "
        "(default: CUDA free memory less a margin; no budget on CPU)",
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
    prep = sub.add_parser(
        "prepare-data",
        formatter_class=_HelpFormatter,
        help="build a token cache (meta.json + shards)",
        description="Tokenize a corpus (the built-in demo text, UTF-8 files or token arrays) into "
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
    tr = sub.add_parser(
        "train",
        formatter_class=_HelpFormatter,
        help="train a run (rerun the same command to resume)",
        description="Train a run into its run directory (resolved.yaml, epoch-NNN.safetensors, "
        "final.pt, train-log.jsonl); the same command resumes an interrupted run, and does "
        "nothing for a finished one.",
    )
    _add_config(tr)
    tr.add_argument("--run-dir", required=True, help="run directory, e.g. runs/demo")
    tr.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    tr.add_argument("--stop-after-epoch", type=int, help="stop at this virtual epoch (resume later)")
    tr.set_defaults(func=commands.train)


def _add_analyze_state(sub: argparse._SubParsersAction) -> None:
    an = sub.add_parser(
        "analyze-state",
        formatter_class=_HelpFormatter,
        help="gradient noise and curvature of one state on one data case",
        description="Measure one parameter state (one or more alias checkpoints) on one data "
        "case and write one result JSON atomically; progress on stderr.",
    )
    _add_state_arguments(an)
    an.set_defaults(func=commands.analyze_state)


def _add_analyze_spectrum(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser(
        "analyze-spectrum",
        formatter_class=_HelpFormatter,
        help="Hessian spectrum of one state on one data case",
        description="Lanczos top eigenpairs with residuals, SLQ density nodes, gradient/noise "
        "alignment with the top eigenvectors, a damped CG solve and block-diagonal errors; "
        "one result JSON, written atomically.",
    )
    _add_state_arguments(sp)
    defaults = SPECTRUM
    sp.add_argument("--top-k", type=int, default=defaults["top_k"], help="eigenpairs reported")
    sp.add_argument(
        "--lanczos-steps",
        type=int,
        default=defaults["lanczos_steps"],
        help="most Lanczos iterations (stops earlier once the top eigenpairs converge)",
    )
    sp.add_argument(
        "--lanczos-tolerance",
        type=float,
        help="converged: residual <= this x |eigenvalue| (default 1e-6 in float64, 1e-3 in float32)",
    )
    sp.add_argument(
        "--lanczos-basis",
        default=defaults["lanczos_basis"],
        choices=LANCZOS_BASES,
        help="storage dtype of the Lanczos vectors",
    )
    sp.add_argument(
        "--lanczos-reduction",
        default=defaults["lanczos_reduction"],
        choices=["float64", "float32"],
        help="dtype of the Lanczos dot products, norms and reorthogonalisation",
    )
    sp.add_argument("--slq-vectors", type=int, default=defaults["slq_vectors"], help="SLQ starting vectors")
    sp.add_argument("--slq-steps", type=int, default=defaults["slq_steps"], help="SLQ Lanczos steps per vector")
    sp.add_argument(
        "--block-samples", type=int, default=defaults["block_samples"], help="directions for the block-diagonal error"
    )
    sp.add_argument("--cg-damping", type=float, help="λ of (H + λI)x = ḡ (default: 2 x largest |eigenvalue|)")
    sp.add_argument("--cg-rtol", type=float, default=defaults["cg_rtol"], help="CG relative residual target")
    sp.add_argument("--cg-max-iterations", type=int, default=defaults["cg_max_iterations"], help="CG iteration cap")
    sp.set_defaults(func=commands.analyze_spectrum)


def _add_plot_analysis(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser(
        "plot-analysis",
        formatter_class=_HelpFormatter,
        help="redraw an analysis's figures from its saved results",
        description="Redraw the figures of an analysis directory from its summary.csv and "
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


def _add_import_hf(sub: argparse._SubParsersAction) -> None:
    ih = sub.add_parser(
        "import-hf",
        formatter_class=_HelpFormatter,
        help="make a run directory from local Hugging Face checkpoint directories",
        description="Read local Hugging Face causal-LM directories (config.json and safetensors "
        "weights; no download), the checkpoints of one model, into a new run directory: "
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
    ih.add_argument("directories", nargs="+", type=Path, help="local Hugging Face model directories, oldest first")
    ih.add_argument("--run-dir", required=True, type=Path, help="new run directory, e.g. runs/imported")
    _add_config(ih)
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
    ih.add_argument(
        "--adapter",
        action="store_true",
        help="keep transformers' own model even for a natively read architecture (measured with the "
        "HVP engines; to compare the two, or for a configuration transformers computes differently)",
    )
    ih.set_defaults(func=commands.import_hf)


def _add_export_hf(sub: argparse._SubParsersAction) -> None:
    eh = sub.add_parser(
        "export-hf",
        formatter_class=_HelpFormatter,
        help="write a run's checkpoint as a Hugging Face model directory",
        description="Write one checkpoint of a run as a Hugging Face directory of its architecture "
        "(LlamaForCausalLM, GPT2LMHeadModel, or an imported model's own; config.json, "
        "model.safetensors) that transformers opens with from_pretrained; the directory must not "
        "exist yet.",
    )
    eh.add_argument("--run", required=True, type=Path, help="run directory (holds resolved.yaml)")
    eh.add_argument("--checkpoint", required=True, help="epoch-NNN.safetensors or final.pt, relative to the run")
    eh.add_argument("--out", required=True, type=Path, help="new output directory")
    eh.set_defaults(func=commands.export_hf)


def _add_summarize(sub: argparse._SubParsersAction) -> None:
    sm = sub.add_parser(
        "summarize",
        formatter_class=_HelpFormatter,
        help="print an analysis's summary table with standard errors and flags",
        description="Print the summary table of a collected analysis (results/<name>) in the "
        "terminal: each checkpoint and case with its statistics ± one standard error, then "
        "plain-language flags (B_noise above the training batch, curvature within one standard "
        "error of 0, precision audit over its threshold, unconverged eigenvalues, data order).",
    )
    sm.add_argument("analysis", type=Path, help="analysis directory, e.g. results/demo")
    sm.set_defaults(func=commands.summarize)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cm = sub.add_parser(
        "compare",
        formatter_class=_HelpFormatter,
        help="compare seed experiments in one figure (from their comparison.csv)",
        description="Draw the mean over seeds (or seed pairs) of selected metrics for several "
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
        print(f"tiny-llm {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
