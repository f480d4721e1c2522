"""The statistics of one (state, case) on an FSDP2-sharded model, on 2 and 3 CPU ranks (gloo,
float64): every statistic, standard error, per-block statistic (block-diagonal curvature included),
per-sample record, consensus error and step to a successor (the trajectory statistics, whole and
per block) equals the one-process measurement with the same engine, to
1e-12 with the exact Taylor-mode forms and to the finite-difference error with the fallback; the
Rademacher directions are the one-process signs, drawn in chunks of a shard."""

import dataclasses
import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from builders import make_oracle_run
from oracles import dense_epoch_hessian

from tiny_llm.architectures import ARCHITECTURES, build_model
from tiny_llm.curvature import vectors
from tiny_llm.curvature.engines import sharded_names
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.sharded import shard_layout, shard_rows
from tiny_llm.curvature.vectors import rademacher
from tiny_llm.data.tokens import TokenCache, epoch_plan

CPU64 = Precision(torch.device("cpu"), torch.float64)


def _model(config, architecture: str):
    torch.manual_seed(1)
    model_config = dataclasses.replace(
        config.model, architecture=architecture, tie_embeddings=architecture != "gpt_neox"
    )
    return build_model(model_config, attention_backend="reference").double()


def _consensus(model) -> list[torch.Tensor]:
    """Two packed workers' consensus errors, per parameter (one of them zero)."""
    generator = torch.Generator().manual_seed(4)
    return [
        [torch.randn(p.shape, dtype=torch.float64, generator=generator) * 1e-2 for p in model.parameters()],
        [torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()],
    ]


def _step(model) -> list[torch.Tensor]:
    """A step to a successor checkpoint, Δ = θ' − θ, per parameter."""
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(p.shape, dtype=torch.float64, generator=generator) * 1e-2 for p in model.parameters()]


def _preconditioner(model) -> list[torch.Tensor]:
    """An optimizer's preconditioner P's diagonal, per parameter (positive, spread over decades)."""
    generator = torch.Generator().manual_seed(9)
    return [10 ** torch.rand(p.shape, dtype=torch.float64, generator=generator).mul(3) for p in model.parameters()]


def _inputs(config, engine: str, consensus, sharded: bool, step=None, preconditioner=None) -> CaseInputs:
    cache = TokenCache(config.data.cache)
    return CaseInputs(
        cache=cache,
        plan=epoch_plan(config, 1),
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=2,
        noise_samples=3,
        random_samples=3,
        seed=11,
        engine=engine,
        directions_per_pass=4,
        compile=False,
        workers=2,
        consensus=consensus,
        block_curvature=True,
        sharded=sharded,
        audit=(1, 2),  # the precision audit, sharded too (float64 here: its errors are rounding)
        step=step,
        preconditioner=preconditioner,
    )


def _rank(
    rank: int, size: int, store: str, out: str, config, architecture: str, engine: str, dtype: str = "float64"
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        model = _model(config, architecture).to(getattr(torch, dtype))
        consensus = [(w, shard_rows(e, rank, size)) for w, e in enumerate(_consensus(model))]
        precision = Precision(torch.device("cpu"), getattr(torch, dtype))
        step = shard_rows(_step(model), rank, size)
        P = shard_rows(_preconditioner(model), rank, size)
        inputs = _inputs(config, engine, consensus, sharded=True, step=step, preconditioner=P)
        result = measure_case(model, inputs, precision)
        assert all(type(p).__name__ == "DTensor" for p in model.parameters())  # it was sharded
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _numbers(result: dict) -> dict:
    """Every number a result reports but its timings and counts."""
    numbers = {
        key: result[key]
        for key in (
            "statistics",
            "standard_errors",
            "consensus",
            "blocks",
            "noise_samples",
            "random_directions",
            "preconditioned",
        )
    }
    # The audit's numbers (its float64 forms: taylor sharded, adjoint whole, equal to rounding). Its
    # errors, float64 against float64 here, are rounding: checked apart (``_audit_errors``).
    errors = (
        "reference",
        "statistics_signed_error",
        "statistics_relative_error",
        "max_statistic_relative_error",
        "max_relative_error",
    )
    audit = {k: v for k, v in result["audit"].items() if k not in errors}
    audit["directions"] = [{k: v for k, v in d.items() if k != "relative_error"} for d in audit["directions"]]
    return numbers | {"audit": audit}


def _audit_errors(result: dict) -> list[float]:
    audit = result["audit"]
    return [d["relative_error"] for d in audit["directions"]] + [
        abs(v) for v in audit["statistics_signed_error"].values() if v is not None
    ]


def _assert_equal(sharded, single, rel: float, where: str = "") -> None:
    if isinstance(single, dict):
        assert set(sharded) == set(single), where
        for key in (k for k in single if "seconds" not in k):
            _assert_equal(sharded[key], single[key], rel, f"{where}.{key}")
    elif isinstance(single, list):
        assert len(sharded) == len(single), where
        for i, (a, b) in enumerate(zip(sharded, single, strict=True)):
            _assert_equal(a, b, rel, f"{where}[{i}]")
    elif isinstance(single, float) and not isinstance(sharded, bool):
        assert sharded == pytest.approx(single, rel=rel, abs=rel * 1e-3), where
    else:
        assert sharded == single, where


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_oracle_run(tmp_path_factory.mktemp("sharded-noise"), tokens=3 * 6 * 5 * 2)  # 5 batches


NATIVE = [a.name for a in ARCHITECTURES.values() if a.jets]
"""Every architecture with second-order rules, from the registry (a new one is tested sharded too)."""


def _cases() -> list:
    """Every engine the registry runs sharded: the exact forms on every architecture (and on 3 ranks),
    the products on one. ``make test`` runs the first of each engine on 2 ranks; the rest (about 2
    minutes on 2 cores) are marked slow, for ``make test-slow``."""
    forms = [(a, 2 + i % 2) for i, a in enumerate(NATIVE)] + [(NATIVE[0], 3)]
    cases = [(a, r, e) for e in sharded_names("forms") for a, r in forms]
    cases += [("llama", 2, e) for e in sharded_names("products")]
    first = {e: next(c for c in cases if c[2] == e and c[1] == 2) for _, _, e in cases}
    return [c if c in first.values() else pytest.param(*c, marks=pytest.mark.slow) for c in cases]


@pytest.mark.parametrize(("architecture", "ranks", "engine"), _cases())
def test_sharded_statistics_equal_one_process(tmp_path, run, architecture, ranks, engine):
    model = _model(run, architecture)
    flat = FlatParameters(model)
    consensus = [(w, flat.flatten(e)) for w, e in enumerate(_consensus(model))]
    step, P = flat.flatten(_step(model)), flat.flatten(_preconditioner(model))
    single = measure_case(model, _inputs(run, engine, consensus, True, step, P), CPU64)  # one rank: whole
    mp.start_processes(
        _rank,
        args=(ranks, str(tmp_path / "store"), str(tmp_path / "out"), run, architecture, engine),
        nprocs=ranks,
        start_method="spawn",
    )
    parts = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(ranks)]
    exact = engine == "taylor"
    # audited, sharded, against exact float64 forms (as one process's audit): the differences' step
    # error is part of what the audit finds for finite differences
    assert max(_audit_errors(parts[0])) < (1e-9 if exact else 1e-6) and len(parts[0]["audit"]["directions"]) == 2 * 3
    for part in parts:  # every rank holds the statistics
        _assert_equal(_numbers(part), _numbers(single), 1e-12 if exact else 1e-6)
        assert part["counts"] == single["counts"] | {"hvp_passes": part["counts"]["hvp_passes"]}
        assert part["measurement_plan"] == single["measurement_plan"]  # the plan, sharded
        assert part["measurement_plan"]["audit_directions"] == 2 * 3
    assert parts[0]["statistics"]["actual_loss_change"] is not None and "step_curvature" in parts[0]["blocks"][0]
    if exact:  # and the Gauss–Newton split came along
        assert parts[0]["statistics"]["noise_gauss_newton"] is not None
    else:  # the fallback's forms are the dense Hessian's within its step error
        cache = TokenCache(run.data.cache)
        H = dense_epoch_hessian(model, torch.cat([cache.tokens(b) for b in epoch_plan(run, 1).blocks]))
        s = rademacher(H.shape[0], 11, 0)
        assert parts[0]["random_directions"][0]["curvature"] == pytest.approx(float(s @ H @ s), rel=1e-6)
        assert parts[0]["statistics"]["noise_gauss_newton"] is None


def test_a_float32_sharded_audit_measures_what_one_process_measures(tmp_path, run):
    """In float32 the sharded audit finds the production precision's real error: its float64 forms
    are one process's (1e-9), its float32 forms one process's to float32 rounding, and the errors
    they imply agree to float32's floor (the sharded loss sums each token's vocabulary in the ranks'
    row blocks, so its float32 rounding is not one process's: either lands up to a few 1e-6 from
    float64)."""
    model = _model(run, "llama").float()
    flat = FlatParameters(model)
    consensus = [(w, flat.flatten(e)) for w, e in enumerate(_consensus(model))]
    cpu32 = Precision(torch.device("cpu"), torch.float32)
    P = flat.flatten(_preconditioner(model))  # as the ranks': both geometries audited
    single = measure_case(model, _inputs(run, "taylor", consensus, sharded=True, preconditioner=P), cpu32)["audit"]
    mp.start_processes(
        _rank,
        args=(2, str(tmp_path / "store"), str(tmp_path / "out"), run, "llama", "taylor", "float32"),
        nprocs=2,
        start_method="spawn",
    )
    audit = json.loads((tmp_path / "out.0").read_text())["audit"]
    assert 0 < audit["max_relative_error"] < 1e-3 and audit["geometries"] == ["plain", "preconditioned"]
    for d, e in zip(audit["directions"], single["directions"], strict=True):
        assert d["float64"] == pytest.approx(e["float64"], rel=1e-9) and d["kind"] == e["kind"]
        assert d["production"] == pytest.approx(e["production"], rel=1e-5)
        assert d["relative_error"] == pytest.approx(e["relative_error"], rel=0.5, abs=3e-6)
    assert audit["loss"]["float64"] == pytest.approx(single["loss"]["float64"], rel=1e-12)


def test_sharded_rademacher_signs_are_the_one_process_signs(monkeypatch):
    """A shard's signs, drawn a chunk at a time (chunks smaller than D here), are the whole
    direction's entries at the shard's positions, for every rank of an uneven split."""
    monkeypatch.setattr(vectors, "RADEMACHER_CHUNK", 37)
    shapes = [torch.Size([16, 8]), torch.Size([8]), torch.Size([5, 3, 2])]
    D = sum(math.prod(s) for s in shapes)
    whole = rademacher(D, 7, 2)
    for rank in range(3):
        layout = shard_layout(shapes, rank, 3)
        assert torch.equal(rademacher(D, 7, 2, layout.indices), whole[layout.indices])
        tensors = [torch.arange(math.prod(s), dtype=torch.float64).reshape(s) + i * 1000 for i, s in enumerate(shapes)]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        assert torch.equal(shard_rows(tensors, rank, 3), flat[layout.indices])


def test_the_generator_sequence_does_not_depend_on_how_it_is_cut():
    """What chunked drawing relies on: torch's CPU generator gives the same signs drawn at once
    or in pieces (a change of torch that broke this would change sharded directions)."""
    generator = torch.Generator().manual_seed(3)
    whole = torch.randint(0, 2, (5_000_003,), generator=generator, dtype=torch.int8)
    generator = torch.Generator().manual_seed(3)
    pieces = [torch.randint(0, 2, (n,), generator=generator, dtype=torch.int8) for n in (7, 1 << 21, 2_902_844)]
    assert torch.equal(whole, torch.cat(pieces))


def test_the_sharded_setting_resolves_its_engine_and_refuses_what_does_not_shard():
    """auto is the exact Taylor mode (finite differences without second-order rules); an engine that
    does not run sharded is refused by name; the audit runs sharded as it does whole."""
    from types import SimpleNamespace

    from tiny_llm.workers.settings import AnalysisSettings, quadratic_form_engine

    assert quadratic_form_engine(AnalysisSettings(sharded=True)) == "taylor"
    hf = SimpleNamespace(architecture="hf")  # a model of the adapter's: no second-order rules
    assert quadratic_form_engine(AnalysisSettings(sharded=True), hf) == "finite_difference"
    assert quadratic_form_engine(AnalysisSettings(sharded=True, engine="finite_difference")) == "finite_difference"
    for engine in ("adjoint", "double_backward", "pearlmutter"):
        with pytest.raises(ValueError, match=f"sharded: .*not {engine}"):
            quadratic_form_engine(AnalysisSettings(sharded=True, engine=engine))
    assert AnalysisSettings(sharded=True).audited == AnalysisSettings().audited  # sharded, audited alike


def test_finite_differences_are_refused_under_bf16_autocast_before_any_work():
    """Forms or products by differences under amp (their error would be the bf16 forward's
    rounding) are refused by the settings, naming amp; the exact sharded forms keep it."""
    from types import SimpleNamespace

    from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings, quadratic_form_engine, sharded_engine

    hf = SimpleNamespace(architecture="hf")
    for settings, model in (
        (AnalysisSettings(engine="finite_difference", amp=True), None),
        (AnalysisSettings(sharded=True, engine="finite_difference", amp=True), None),
        (AnalysisSettings(sharded=True, amp=True), hf),
    ):
        with pytest.raises(ValueError, match=r"under bf16 autocast \(amp\) .*without amp"):
            quadratic_form_engine(settings, model)
        assert quadratic_form_engine(dataclasses.replace(settings, amp=False), model) == "finite_difference"
    assert quadratic_form_engine(AnalysisSettings(sharded=True, amp=True)) == "taylor"
    assert quadratic_form_engine(AnalysisSettings(amp=True), hf) == "double_backward"
    for settings, spectrum in (
        (AnalysisSettings(amp=True), SpectrumSettings(sharded=True)),
        (AnalysisSettings(sharded=True, amp=True), SpectrumSettings()),
    ):
        with pytest.raises(
            ValueError, match=rf"^{'spectrum.sharded' if spectrum.sharded else 'settings.sharded'}: .*without amp"
        ):
            sharded_engine(settings, spectrum)
        assert sharded_engine(AnalysisSettings(sharded=settings.sharded), spectrum) == "finite_difference"
    assert sharded_engine(AnalysisSettings(amp=True), SpectrumSettings()) is None  # unsharded: exact products
