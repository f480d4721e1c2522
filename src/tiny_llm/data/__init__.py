"""Token data: the token cache (meta.json and raw shards) and the token stream with its shuffle
groups and batch plans (tokens: the seen and unseen epochs), writing a cache (preparation), the
corpus sources that fill it (corpus: the demo generator, text files, token files), and where a
case's batches lie in those sources (order).
"""

from tiny_llm.data.corpus import (
    BYTE_TOKENIZER,
    DEMO_GENERATOR_VERSION,
    default_capacity,
    demo_corpus,
    prepare_source_cache,
    read_text_files,
    read_token_files,
    read_tokenizer,
)
from tiny_llm.data.order import order_report, order_warnings
from tiny_llm.data.preparation import prepare_cache
from tiny_llm.data.tokens import (
    BatchPlan,
    TokenCache,
    blocks_for_tokens,
    capacity_blocks,
    check_capacity,
    derive_seed,
    epoch_plan,
    offset_plan,
    stream_batches,
    unseen_plan,
)

__all__ = [
    "BYTE_TOKENIZER",
    "BatchPlan",
    "DEMO_GENERATOR_VERSION",
    "TokenCache",
    "blocks_for_tokens",
    "capacity_blocks",
    "check_capacity",
    "default_capacity",
    "demo_corpus",
    "derive_seed",
    "epoch_plan",
    "offset_plan",
    "order_report",
    "order_warnings",
    "prepare_cache",
    "prepare_source_cache",
    "read_text_files",
    "read_token_files",
    "read_tokenizer",
    "stream_batches",
    "unseen_plan",
]
