"""The ``tiny-llm`` command line: prepare-data and train (analysis commands join later)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tiny_llm.config import RunConfig, apply_overrides, config_from_dict, load_config_dict
from tiny_llm.corpus import default_capacity, prepare_source_cache
from tiny_llm.train import train

log = logging.getLogger("tiny_llm")


def _config(args: argparse.Namespace, fallback: Path | None = None) -> RunConfig:
    """The run configuration from --config (or ``fallback``) plus --set overrides."""
    path = args.config or fallback
    data = load_config_dict(path) if path else {}
    try:
        return config_from_dict(apply_overrides(data, args.set))
    except ValueError as error:
        raise ValueError(f"{path or 'default configuration'}: {error}") from None


def _prepare_data(args: argparse.Namespace) -> None:
    config = _config(args)
    # Demo: what this run plus one unseen epoch need; files: every whole group, unless set.
    capacity = default_capacity(config) if args.source == "demo" else config.data.prepare_train_tokens
    out = prepare_source_cache(config.data, args.source, args.inputs, capacity=capacity, out=args.out,
                               demo_seed=args.demo_seed,
                               shard_tokens=args.shard_tokens, token_dtype=args.token_dtype,
                               vocab_size=args.vocab_size, tokenizer_description=args.tokenizer_description)
    log.info("token cache ready: %s", out)


def _train(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir)
    resolved = run_dir / "resolved.yaml"
    config = _config(args, fallback=resolved if resolved.exists() else None)
    final = train(config, run_dir, device=args.device, stop_after_epoch=args.stop_after_epoch)
    print(final)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiny-llm", description=__doc__)
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="run configuration YAML (sections model, data, training)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a configuration key, e.g. training.lr=0.001 (repeatable)")

    prep = sub.add_parser("prepare-data", help="build a token cache (meta.json + shards)")
    add_config(prep)
    prep.add_argument("--out", help="cache directory (default: data.cache of the configuration)")
    prep.add_argument("--source", choices=["demo", "text", "tokens"], default="demo",
                      help="demo: built-in synthetic corpus; text: UTF-8 files; tokens: .npy or raw .bin arrays")
    prep.add_argument("inputs", nargs="*", type=Path, help="input files for --source text|tokens")
    prep.add_argument("--demo-seed", type=int, default=0, help="seed of the demo corpus generator")
    prep.add_argument("--shard-tokens", type=int, default=1 << 20, help="approximate tokens per shard")
    prep.add_argument("--token-dtype", default="uint16", choices=["uint16", "uint32", "int32", "int64"],
                      help="element type of raw .bin token files")
    prep.add_argument("--vocab-size", type=int, default=256, help="vocabulary size of --source tokens")
    prep.add_argument("--tokenizer-description", default="", help="recorded in meta.json for --source tokens")
    prep.set_defaults(func=_prepare_data)

    tr = sub.add_parser("train", help="train a run (rerun the same command to resume)")
    add_config(tr)
    tr.add_argument("--run-dir", required=True, help="run directory, e.g. runs/demo")
    tr.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    tr.add_argument("--stop-after-epoch", type=int, help="stop at this virtual epoch (resume later)")
    tr.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tiny-llm`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        args.func(args)
    except ValueError as error:
        print(f"tiny-llm {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
