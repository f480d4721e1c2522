"""What each tiny-llm command runs from its parsed options: prepare-data's source built from them
(the demo's seed, text files), the run configuration with --set overrides refused by key."""

import pytest

from tiny_llm import commands
from tiny_llm.cli import _parser
from tiny_llm.data.tokens import TokenCache

SMALL = ["--set", "data.seq_len=8", "--set", "data.prepare_train_tokens=256", "--set", "model.max_seq_len=8"]


def _run(*argv):
    args = _parser().parse_args(list(argv))
    args.func(args)
    return args


def test_prepare_data_builds_the_cache_its_options_describe(tmp_path):
    _run("prepare-data", "--source", "demo", "--demo-seed", "3", "--out", str(tmp_path / "demo"), *SMALL)
    demo = TokenCache(tmp_path / "demo")
    assert demo.meta["source"]["kind"] == "demo" and demo.meta["source"]["seed"] == 3 and demo.n_blocks > 0
    (tmp_path / "a.txt").write_text("words of a small corpus " * 200)
    _run("prepare-data", "--source", "text", str(tmp_path / "a.txt"), "--out", str(tmp_path / "text"), *SMALL)
    text = TokenCache(tmp_path / "text")
    assert text.meta["tokenizer"]["type"] == "byte" and text.meta["source"]["files"][0]["path"].endswith("a.txt")


def test_a_bad_override_is_refused_naming_where_it_came_from(tmp_path):
    args = _parser().parse_args(["train", "--run-dir", str(tmp_path / "run"), "--set", "model.nope=1"])
    with pytest.raises(ValueError, match=r"^default configuration: .*model.nope"):
        commands._config(args)
    assert not (tmp_path / "run").exists()
