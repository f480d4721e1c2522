"""Snakemake adapter: prepare one token cache, then write its receipt."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.config import DataConfig  # noqa: E402
from tiny_llm.data.corpus import Source, prepare_source_cache  # noqa: E402
from tiny_llm.data.tokens import TokenCache  # noqa: E402
from tiny_llm.io import atomic_write_json  # noqa: E402

spec = snakemake.params.spec
receipt = Path(snakemake.output.receipt)
out = prepare_source_cache(
    DataConfig(**spec["data"]),
    Source(spec["cache_source"], tuple(Path(p) for p in spec["cache_inputs"]), tokenizer_dir=spec.get("tokenizer")),
    capacity=spec["capacity"],
    out=receipt.with_name(receipt.name.removesuffix(".prepared.json")),
    shard_tokens=spec["shard_tokens"],
    keep_order=spec.get("keep_order", False),
)
cache = TokenCache(out)
# The spec it was prepared for: a later plan with another refuses at start-up, before Snakemake would
# delete this receipt to prepare the cache again (and fail on the cache it holds).
atomic_write_json(receipt, {"cache": str(out), "blocks": cache.n_blocks, "shards": cache.meta["shards"], "spec": spec})
