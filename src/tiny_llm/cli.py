"""The ``tiny-llm`` command line: prepare-data, train, analyze-state, analyze-spectrum, plot-analysis,
summarize, import-hf, export-hf.

The parser needs no torch: each command imports what it runs when it runs (``--help`` stays fast),
and the analysis options take their defaults and choices from the torch-free settings classes and
the engine registry.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from tiny_llm.config import RunConfig, apply_overrides, config_from_dict, load_config_dict
from tiny_llm.layout import RESOLVED
from tiny_llm.workers.settings import CASES, ENGINE_SETTINGS, LANCZOS_BASES, AnalysisSettings, SpectrumSettings

log = logging.getLogger("tiny_llm")

ANALYSIS = {f.name: f.default for f in dataclasses.fields(AnalysisSettings)}
"""AnalysisSettings' defaults: the options of the analysis commands show and use them."""
SPECTRUM = {f.name: f.default for f in dataclasses.fields(SpectrumSettings)}
"""SpectrumSettings' defaults."""


def _config(args: argparse.Namespace, fallback: Path | None = None) -> RunConfig:
    """The run configuration from --config (or ``fallback``) plus --set overrides."""
    path = args.config or fallback
    data = load_config_dict(path) if path else {}
    try:
        return config_from_dict(apply_overrides(data, args.set))
    except ValueError as error:
        raise ValueError(f"{path or 'default configuration'}: {error}") from None


def _prepare_data(args: argparse.Namespace) -> None:
    from tiny_llm.data.corpus import default_capacity, prepare_source_cache

    config = _config(args)
    if args.tokenizer is not None:
        _check_tokenizer_fits(args)
    # Demo: what this run plus one unseen epoch need; files: every whole group, unless set.
    capacity = default_capacity(config) if args.source == "demo" else config.data.prepare_train_tokens
    out = prepare_source_cache(
        config.data,
        args.source,
        args.inputs,
        capacity=capacity,
        out=args.out,
        demo_seed=args.demo_seed,
        shard_tokens=args.shard_tokens,
        token_dtype=args.token_dtype,
        vocab_size=args.vocab_size,
        tokenizer_description=args.tokenizer_description,
        keep_order=args.keep_order,
        tokenizer_dir=args.tokenizer,
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


def _train(args: argparse.Namespace) -> None:
    from tiny_llm.training.loop import train

    run_dir = Path(args.run_dir)
    resolved = run_dir / RESOLVED
    config = _config(args, fallback=resolved if resolved.exists() else None)
    final = train(config, run_dir, device=args.device, stop_after_epoch=args.stop_after_epoch)
    print(final)


def _import_hf(args: argparse.Namespace) -> None:
    from tiny_llm.model.hf_runs import import_run

    print(
        import_run(
            args.directories,
            args.run_dir,
            _config(args),
            steps=args.step,
            tokens=args.tokens,
            tokens_per_step=args.tokens_per_step,
        )
    )


def _export_hf(args: argparse.Namespace) -> None:
    from tiny_llm.model.hf_runs import export_run

    print(export_run(args.run, args.checkpoint, args.out))


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


def _analyze_state(args: argparse.Namespace) -> None:
    from tiny_llm.distributed import init_from_environment, is_writer
    from tiny_llm.workers.state import analyze_state

    init_from_environment(args.device)  # under torchrun: one rank of the data-parallel passes
    result = analyze_state(
        args.run, args.checkpoint, args.case, _analysis_settings(args), args.output, expect_key=args.expect_key
    )
    if is_writer():
        print(json.dumps(result["statistics"], indent=1))


def _summarize(args: argparse.Namespace) -> None:
    from tiny_llm.results.summarize import summarize

    print(summarize(args.analysis))


def _plot_analysis(args: argparse.Namespace) -> None:
    from tiny_llm.results.figures import plot_analysis

    for path in plot_analysis(args.output, training_norms=args.training_norms, x_axis=args.x_axis):
        print(path)


def _add_state_arguments(an: argparse.ArgumentParser) -> None:
    """Inputs and numerical settings shared by the analysis workers."""
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
    an.add_argument("--device", default=ANALYSIS["device"], help="cpu, cuda, cuda:N or auto (cuda when available)")
    an.add_argument("--dtype", default=ANALYSIS["dtype"], choices=["float32", "float64"], help="parameter dtype")
    an.add_argument("--no-tf32", action="store_true", help="IEEE float32 matmuls on CUDA")
    an.add_argument("--amp", action="store_true", help="bf16 autocast in the forward (requires float32)")
    an.add_argument("--no-consensus", action="store_true", help="packed runs: skip consensus errors")
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
    an.add_argument("--expect-key", help="refuse unless the checkpoints hash to this state key")


def _analysis_settings(args: argparse.Namespace) -> AnalysisSettings:
    return AnalysisSettings(
        noise_samples=args.noise_samples,
        random_samples=args.random_samples,
        seed=args.seed,
        hvp_batch_size=args.hvp_batch_size,
        directions_per_pass=args.directions_per_pass,
        engine=args.engine,
        compile_hvp=not args.no_compile_hvp,
        device=args.device,
        dtype=args.dtype,
        tf32=not args.no_tf32,
        amp=args.amp,
        consensus=not args.no_consensus,
        audit={"auto": "auto", "on": True, "true": True, "off": False, "false": False}[args.audit],
        audit_directions=args.audit_directions,
        audit_batches=args.audit_batches,
        data_offset=args.data_offset,
        memory_budget_gb=args.memory_budget_gb,
    )


def _analyze_spectrum(args: argparse.Namespace) -> None:
    from tiny_llm.distributed import init_from_environment, is_writer
    from tiny_llm.workers.spectrum import analyze_spectrum

    init_from_environment(args.device)  # under torchrun: one rank of the data-parallel passes
    spectrum = SpectrumSettings(
        top_k=args.top_k,
        lanczos_steps=args.lanczos_steps,
        lanczos_tolerance=args.lanczos_tolerance,
        lanczos_basis=args.lanczos_basis,
        lanczos_reduction=args.lanczos_reduction,
        slq_vectors=args.slq_vectors,
        slq_steps=args.slq_steps,
        block_samples=args.block_samples,
        cg_damping=args.cg_damping,
        cg_rtol=args.cg_rtol,
        cg_max_iterations=args.cg_max_iterations,
        sharded=args.sharded,
    )
    result = analyze_spectrum(
        args.run,
        args.checkpoint,
        args.case,
        _analysis_settings(args),
        spectrum,
        args.output,
        expect_key=args.expect_key,
    )
    if is_writer():
        print(json.dumps({"top_eigenvalues": result["top_eigenvalues"], "cg": result["cg"]}, indent=1))


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
    prep.set_defaults(func=_prepare_data)


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
    tr.set_defaults(func=_train)


def _add_analyze_state(sub: argparse._SubParsersAction) -> None:
    an = sub.add_parser(
        "analyze-state",
        formatter_class=_HelpFormatter,
        help="gradient noise and curvature of one state on one data case",
        description="Measure one parameter state (one or more alias checkpoints) on one data "
        "case and write one result JSON atomically; progress on stderr.",
    )
    _add_state_arguments(an)
    an.set_defaults(func=_analyze_state)


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
    sp.add_argument(
        "--sharded",
        action="store_true",
        help="under torchrun: shard the model and every vector over the ranks (FSDP2); the products are "
        "finite differences of gradients",
    )
    sp.set_defaults(func=_analyze_spectrum)


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
    pl.set_defaults(func=_plot_analysis)


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
        "LlamaForCausalLM and GPT2LMHeadModel become this project's models (every engine); a "
        "configuration they cannot represent is refused by name. Any other architecture keeps "
        "its weights and config.json (hf-config.json) and is measured through an adapter with the "
        "HVP engines. Seen and unseen do not apply to an imported run: analyse it on the offset "
        "case (a batch-aligned epoch of the cache from a stated offset).",
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
    ih.set_defaults(func=_import_hf)


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
    eh.set_defaults(func=_export_hf)


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
    sm.set_defaults(func=_summarize)


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
    cm.set_defaults(func=_compare)


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


def _compare(args: argparse.Namespace) -> None:
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tiny-llm`` console script."""
    args = _parser().parse_args(argv)
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
