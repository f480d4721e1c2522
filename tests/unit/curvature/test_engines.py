"""The engine registry: every list of engines derives from it, and nothing else names an engine in
a comparison."""

import re
from pathlib import Path

import pytest
import yaml
from oracles import TINY_MODEL

from tiny_llm.curvature.engines import AUTO, ENGINES, GRADIENT, Engine, benchmarked, engine, names, register
from tiny_llm.curvature.memory import COEFFICIENTS
from tiny_llm.workers.settings import ENGINE_SETTINGS, AnalysisSettings

REPO = Path(__file__).resolve().parents[3]


def test_every_engine_declares_a_kind_a_batch_computation_and_a_fitted_memory_model():
    assert names() == ("taylor", "adjoint", "double_backward", "pearlmutter", "finite_difference")
    assert names("forms") + names("products") == tuple(sorted(names(), key=names().index))
    for declared in ENGINES.values():
        assert declared.kind in ("forms", "products")
        assert callable(declared.compute()), declared.name
        assert declared.memory in COEFFICIENTS, f"no memory model for {declared.name}: fit benchmarks/memory.py"
        assert not (declared.jets and declared.products)  # the jet rules give forms, not products
    assert GRADIENT in COEFFICIENTS and set(COEFFICIENTS) == {*(e.memory for e in ENGINES.values()), GRADIENT}


def test_the_settings_the_schema_and_the_configuration_offer_the_registry():
    assert ENGINE_SETTINGS == (AUTO, *names())
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "engine" in node and isinstance(node["engine"], dict) and "enum" in node["engine"]:
                found.append(node["engine"]["enum"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert found and all(tuple(enum) == ENGINE_SETTINGS for enum in found)
    documented = (REPO / "config/config.yaml").read_text()
    comment = re.search(r"engine: auto +#(.*\n(?: +#.*\n)*)", documented).group(1)
    assert re.findall(r"\| (\w+)", comment) == list(names())  # every engine, in the registry's order
    with pytest.raises(ValueError, match="engine: expected one of auto, taylor, adjoint"):
        AnalysisSettings(engine="newton")


def test_unknown_and_duplicate_engines_are_refused_by_name():
    with pytest.raises(ValueError, match="engine: expected one of taylor, adjoint, .* got 'newton'"):
        engine("newton")
    with pytest.raises(ValueError, match="already registered or reserved"):
        register(Engine("adjoint", "forms", "again", "tiny_llm.curvature.forms:adjoint"))
    with pytest.raises(ValueError, match="already registered or reserved"):
        register(Engine(GRADIENT, "products", "a gradient", "tiny_llm.curvature.products:double_backward"))


def test_no_module_outside_the_registry_compares_an_engine_by_name():
    """Engines are dispatched by what they declare (kind, jets, compiled, sharded), so a new engine
    needs no edit elsewhere: no source compares an engine name as a string."""
    engine_name = "|".join(names())
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({engine_name})["']|["']({engine_name})["']\s*(==|!=|\bin\b)""")
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "src/tiny_llm").rglob("*.py"))
        if path.name != "engines.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert offenders == []


def test_the_sharded_capability_dispatches_and_an_engine_without_it_is_refused_by_name(monkeypatch):
    """An engine that declares the sharded placement is what a sharded operator runs (auto picks the
    first registered: exact forms before products, none needing rules the model lacks); one that
    declares none is refused by the operator, naming those that run sharded, before any work."""
    import torch

    from tiny_llm.architectures import build_model
    from tiny_llm.curvature.engines import default_forms_engine, sharded_names
    from tiny_llm.curvature.hessian import Precision
    from tiny_llm.curvature.sharded import ShardedHessian
    from tiny_llm.workers.settings import quadratic_form_engine

    for declared in ENGINES.values():
        if declared.sharded:
            declared.check_placement("sharded")
        else:
            with pytest.raises(ValueError, match=f"engine {declared.name} does not run on a sharded model"):
                declared.check_placement("sharded")
    assert sharded_names() == ("taylor", "finite_difference")
    assert default_forms_engine(16, jets=True, sharded=True) == sharded_names("forms")[0]
    assert default_forms_engine(16, jets=False, sharded=True) == sharded_names("products", jets=False)[0]
    model = build_model(TINY_MODEL)
    tokens = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="engine adjoint does not run on a sharded model; .*taylor, finite_difference"):
        ShardedHessian(
            model, tokens, batch_size=1, precision=Precision(torch.device("cpu"), torch.float64), engine="adjoint"
        )

    # a new engine registered as sharded is chosen and accepted by the settings with no other edit (a
    # copy of the registry stands in for it, so that the real one keeps its order for the other tests)
    from tiny_llm.curvature import engines as registry

    new = Engine(
        "sharded_adjoint",
        "forms",
        "test",
        "tiny_llm.curvature.forms:adjoint",
        jets=True,
        placements=("whole", "data_parallel", "sharded"),
    )
    monkeypatch.setattr(registry, "ENGINES", {**ENGINES, new.name: new})
    assert "sharded_adjoint" in sharded_names("forms")
    assert quadratic_form_engine(AnalysisSettings(sharded=True)) == "taylor"  # registry order: the first
    monkeypatch.setattr(registry, "ENGINES", {k: v for k, v in registry.ENGINES.items() if k != "taylor"})
    assert quadratic_form_engine(AnalysisSettings(sharded=True)) == "sharded_adjoint"


def test_the_benchmarks_and_the_gauss_newton_split_read_the_registry():
    assert benchmarked("memory") == names() and benchmarked("hvp_cost") == names()[:4]
    for script in ("memory.py", "hvp_cost.py"):
        text = (REPO / "benchmarks" / script).read_text()
        assert re.search(r"^ENGINES = .*benchmarked\(", text, re.M) and '"taylor", "adjoint"' not in text
    assert [e.name for e in ENGINES.values() if e.gauss_newton] == ["taylor", "adjoint"]
    with pytest.raises(ValueError, match="only a forms engine computes a Gauss–Newton part"):
        Engine("x", "products", "x", "tiny_llm.curvature.products:double_backward", gauss_newton=True)
