"""Shared tiny cases: a ~1.4k-parameter float64 model for dense oracles and a tiny training setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.func import functional_call, hessian, jvp

from tiny_llm.config import ModelConfig, RunConfig, config_from_dict
from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.data.corpus import BYTE_TOKENIZER, demo_corpus
from tiny_llm.data.tokens import blocks_for_tokens, capacity_blocks, prepare_cache
from tiny_llm.model.jets import Jet, JetPass
from tiny_llm.model.llama import Llama, token_losses

REPO = Path(__file__).resolve().parents[1]
PROJECT = Path(os.environ.get("TINY_LLM_TEST_PROJECT", REPO))
"""The project whose config/ the configuration tests plan: this checkout, or (set by a test that
checks them against an edited configuration) another folder laid out like it."""
_OUTPUTS = {".git", ".venv", "runs", "results", "cache", "logs", ".snakemake", ".pytest_cache"}


def project_view(dest: Path) -> Path:
    """Link the project's own files (config/, and whatever corpus files its configuration names
    relative to it) into ``dest``, leaving out what a workflow writes, so that a dry run in
    ``dest`` plans the user's configuration as it stands without touching the project."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in PROJECT.iterdir():
        if entry.name not in _OUTPUTS and not (dest / entry.name).exists():
            (dest / entry.name).symlink_to(entry)
    return dest


TINY_MODEL = ModelConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_seq_len=8)


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return TINY_MODEL


def dense_epoch_hessian(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """The dense oracle: the explicit (D, D) Hessian of the token-mean loss over ``tokens`` (n, T+1)
    at the model's parameters, in FlatParameters order (``torch.func.hessian``)."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def loss(x):
        logits = functional_call(model, flat.unflatten(x), (tokens[:, :-1],))
        return token_losses(logits, tokens[:, 1:]).mean()

    return hessian(loss)(theta)


def dense_gauss_newton(model, tokens, ignored=()):
    """The dense generalised Gauss–Newton matrix G = Jᵀ (∇²ℓ) J of the token-mean loss, with J the
    Jacobian of the logits (torch.func.jacrev) and ∇²ℓ = (diag(p) − ppᵀ)/N per kept target."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    J = torch.func.jacrev(lambda x: functional_call(model, flat.unflatten(x), (inputs,)))(theta)  # (n, T, V, D)
    logits = functional_call(model, flat.unflatten(theta), (inputs,)).detach()
    p = torch.softmax(logits, dim=-1)
    keep = torch.ones(targets.shape, dtype=torch.float64)
    for row, column in ignored:
        keep[row, column] = 0
    H_out = (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) * keep[..., None, None] / keep.sum()
    return torch.einsum("ntvd,ntvw,ntwe->de", J, H_out, J)


JET_K = 3
"""Directions per jet-rule check."""


def jet_generator(seed):
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def jet_randn(*shape, seed):
    """A float64 standard normal tensor from ``jet_generator(seed)``."""
    return torch.randn(*shape, dtype=torch.float64, generator=jet_generator(seed))


def reference_jet(f, x0, x1, x2):
    """(y1, y2) of t ↦ f(t, x0 + t·x1 + ½t²·x2) at t = 0, by forward mode twice (torch.func)."""

    def path(t):
        return f(t, x0 + t * x1 + 0.5 * t * t * x2)

    def first(t):
        return jvp(path, (t,), (torch.ones((), dtype=torch.float64),))[1]

    zero = torch.zeros((), dtype=torch.float64)
    return first(zero), jvp(first, (zero,), (torch.ones((), dtype=torch.float64),))[1]


def check_module_jet(module, jet_of, x0, *, second_order_input=True, seed=0):
    """Module rule vs torch.func for K directions of its parameters and input."""
    module = module.double()
    names = [n for n, _ in module.named_parameters()]
    dirs = {n: jet_randn(JET_K, *p.shape, seed=seed + i) for i, (n, p) in enumerate(module.named_parameters())}
    x1 = jet_randn(JET_K, *x0.shape, seed=seed + 50)
    x2 = (
        jet_randn(JET_K, *x0.shape, seed=seed + 60)
        if second_order_input
        else torch.zeros(JET_K, *x0.shape, dtype=torch.float64)
    )
    jets = JetPass({p: dirs[n] for n, p in module.named_parameters()})
    out = jet_of(module, Jet(x0, x1, x2 if second_order_input else None), jets)
    for k in range(JET_K):

        def f(t, x, k=k):
            params = {n: p + t * dirs[n][k] for n, p in zip(names, module.parameters(), strict=True)}
            return functional_call(module, params, (x,))

        y1, y2 = reference_jet(f, x0, x1[k], x2[k])
        torch.testing.assert_close(
            out.z0, functional_call(module, dict(module.named_parameters()), (x0,)), rtol=0, atol=1e-13
        )
        torch.testing.assert_close(out.z1[k], y1, rtol=0, atol=1e-11)
        torch.testing.assert_close(out.z2[k], y2, rtol=0, atol=1e-11)


def check_whole_model_jet(model) -> None:
    """model.jet + loss_jet in Taylor mode = d²/dt² of the summed loss along θ + t v (torch.func jvp
    of jvp) for JET_K directions, with ignored targets."""
    inputs = torch.randint(0, 16, (3, 6), generator=jet_generator(40))
    targets = torch.randint(0, 16, (3, 6), generator=jet_generator(41))
    targets[1, 2:4] = -100
    jets = JetPass({p: jet_randn(JET_K, *p.shape, seed=i) for i, p in enumerate(model.parameters())})
    with torch.no_grad():
        taylor = model.loss_jet(model.jet(inputs, jets), targets, jets)
    names = [n for n, _ in model.named_parameters()]
    for k in range(JET_K):

        def f(t, _, k=k):
            params = {n: p + t * jets.directions[p][k] for n, p in zip(names, model.parameters(), strict=True)}
            return token_losses(functional_call(model, params, (inputs,)), targets).sum()

        _, second = reference_jet(f, torch.zeros(()), torch.zeros(()), torch.zeros(()))
        assert float(taylor[k]) == pytest.approx(float(second.detach()), rel=1e-11, abs=1e-11)


@pytest.fixture(scope="session")
def dense_problem():
    """The float64 TINY_MODEL, 7 epoch rows (uneven for every batch size) and its explicit Hessian."""
    torch.manual_seed(0)
    model = Llama(TINY_MODEL, attention_backend="reference").double()
    tokens = torch.randint(0, 16, (7, 7), generator=torch.Generator().manual_seed(2))
    return model, tokens, dense_epoch_hessian(model, tokens)


def make_run_config(cache: Path, **training) -> RunConfig:
    """A fast training setup: byte vocab, width 8, seq_len 8, B=4 with micro-batch 3 (a remainder)."""
    base = {
        "batch_size": 4,
        "micro_batch_size": 3,
        "tokens": 4 * 8 * 3 * 2,
        "epochs": 2,
        "warmup_steps": 1,
        "checkpoint_policy": "interval",
        "log_every": 1000,
    }
    base.update(training)
    return config_from_dict(
        {
            "model": {"vocab_size": 256, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 8},
            "data": {"cache": str(cache), "seq_len": 8, "shuffle_group_blocks": 4, "seed": 7},
            "training": base,
        }
    )


def make_demo_cache(path: Path, config: RunConfig, shard_blocks: int = 5) -> Path:
    """Prepare a demo cache with exactly the capacity training plus one unseen epoch need."""
    tokens = capacity_blocks(config)["unseen"] * config.data.seq_len
    blocks = blocks_for_tokens(tokens, config.data.seq_len, config.data.shuffle_group_blocks)
    return prepare_cache(
        path,
        [demo_corpus(blocks * config.data.seq_len + 1, seed=3)],
        tokenizer=BYTE_TOKENIZER,
        vocab_size=256,
        seq_len=config.data.seq_len,
        shuffle_group_blocks=config.data.shuffle_group_blocks,
        data_seed=config.data.seed,
        prepare_train_tokens=tokens,
        shard_blocks=shard_blocks,
        source={"kind": "demo", "seed": 3},
    )


@pytest.fixture
def make_config(tmp_path: Path):
    """make_config(**training) -> a RunConfig whose (exactly sized) demo cache exists under tmp_path."""

    def make(**training) -> RunConfig:
        probe = make_run_config(tmp_path / "cache", **training)
        cache = tmp_path / f"cache-{capacity_blocks(probe)['unseen']}"
        config = make_run_config(cache, **training)
        if not cache.exists():
            make_demo_cache(cache, config)
        return config

    return make


def make_oracle_run(path: Path, model: dict | None = None, **training) -> RunConfig:
    """A cache of random ids < 16 and a config for the 1.4k-parameter TINY_MODEL (``model``: keys
    changed): seq_len 6, B=3 with micro-batch 2 (a remainder), 3 batches per epoch, 2 epochs,
    shuffle groups of 4."""
    base = {
        "batch_size": 3,
        "micro_batch_size": 2,
        "tokens": 3 * 6 * 3 * 2,
        "epochs": 2,
        "warmup_steps": 1,
        "checkpoint_policy": "interval",
        "lr": 0.05,
        "attention_backend": "reference",
    }
    base.update(training)
    config = config_from_dict(
        {
            "model": {**TINY_MODEL.__dict__, **(model or {})},
            "training": base,
            "data": {"cache": str(path / "cache"), "seq_len": 6, "shuffle_group_blocks": 4, "seed": 3},
        }
    )
    if not (path / "cache").exists():
        ids = torch.randint(
            0, 16, (capacity_blocks(config)["unseen"] * 6 + 1,), generator=torch.Generator().manual_seed(5)
        )
        prepare_cache(
            path / "cache",
            [ids.numpy()],
            tokenizer={"type": "external", "vocab_size": 16},
            vocab_size=16,
            seq_len=6,
            shuffle_group_blocks=4,
            data_seed=3,
            prepare_train_tokens=capacity_blocks(config)["unseen"] * 6,
            shard_blocks=7,
            source={"kind": "test"},
        )
    return config


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def smallest_budget_gb(plan) -> float:
    """The smallest memory budget (GiB, by bisection) that ``plan(budget_gb)`` accepts without a
    ValueError: the one that puts the plan's largest pass at one sequence per group."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        try:
            plan(middle)
            high = middle
        except ValueError:
            low = middle
    return high


_FIRST = {"slurm": 0, "integration": 1}


def pytest_collection_modifyitems(config, items):
    """The Slurm tests first, then the integration tests, then the rest (each file's tests in their
    order): with `make test`'s two workers, the Slurm tests, which mostly wait on the cluster,
    overlap the others instead of running alone at the end."""
    items.sort(key=lambda item: _FIRST.get(Path(str(item.fspath)).parent.name, 2))
