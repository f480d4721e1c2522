"""The numbers of one fixed (state, case) stay what they were: the result blocks of three measured
setups (adjoint and double_backward in float64, taylor in float32 with its precision audit) against
the file written by the code before the engines became a registry and the statistics a
declaration (tests/data/measure-case-golden.json). Keys and their order, integers and strings are
compared exactly, float64 values to 1e-12 relative, float32 ones to 1e-4 (another CPU may round
them differently), except the audit's errors of float32 against float64, which are rounding itself
(their keys are compared); timings are left out. Regenerate only for an intended change of a number, and
say which in the commit. (The per-block keys were added on 2026-12-02, every earlier key and value
kept bit for bit: checked before they were written. The result's ``measurement_plan`` and the
audit's ``geometries`` were added on 2026-12-06 the same way, and the plan's direction ``groups`` and
``audit_groups`` later that day: the other keys and values are the
file's, and c0c2b9d's results on the same CPU equal this code's bit for bit.)"""

import json
import math
from pathlib import Path

import pytest
import torch
from builders import make_oracle_run

from tiny_llm.curvature.hessian import Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.llama import Llama

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "data/measure-case-golden.json").read_text())
SETUPS = [("adjoint", torch.float64, None), ("taylor", torch.float32, (2, 2)), ("double_backward", torch.float64, None)]
TIMES = {"hvp_seconds", "total_seconds", "seconds"}


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if k not in TIMES}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _differences(value, expected, rtol: float, where: str) -> list[str]:
    """Where ``value`` departs from ``expected``: a key, length, type or value (empty when equal)."""
    if isinstance(expected, dict):
        if list(value) != list(expected):
            return [f"{where}: keys {list(value)} != {list(expected)}"]
        return [d for key in expected for d in _differences(value[key], expected[key], rtol, f"{where}.{key}")]
    if isinstance(expected, list):
        if len(value) != len(expected):
            return [f"{where}: {len(value)} items != {len(expected)}"]
        return [
            d
            for i, (v, e) in enumerate(zip(value, expected, strict=True))
            for d in _differences(v, e, rtol, f"{where}[{i}]")
        ]
    if isinstance(expected, float) and rtol > 1e-12 and "error" in where:
        # float32 rounding against float64: its size is the machine's
        return [] if isinstance(value, float) else [f"{where}: {value!r} is not a number"]
    if isinstance(expected, float) and not isinstance(value, bool):
        close = isinstance(value, (int, float)) and math.isclose(value, expected, rel_tol=rtol, abs_tol=rtol * 1e-6)
        return [] if close else [f"{where}: {value!r} != {expected!r}"]
    return [] if value == expected else [f"{where}: {value!r} != {expected!r}"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    config = make_oracle_run(tmp_path_factory.mktemp("golden"), tokens=3 * 6 * 5 * 2)
    return config, TokenCache(config.data.cache), epoch_plan(config, 1)


@pytest.mark.parametrize(("engine", "dtype", "audit"), SETUPS)
def test_the_result_blocks_equal_the_golden_file(case, engine, dtype, audit):
    config, cache, plan = case
    torch.manual_seed(1)
    model = Llama(config.model, attention_backend="reference").to(dtype)
    inputs = CaseInputs(
        cache=cache,
        plan=plan,
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=4,
        noise_samples=3,
        random_samples=5,
        seed=11,
        engine=engine,
        directions_per_pass=1 if engine == "taylor" else 4,
        compile=False,
        audit=audit,
    )
    result = measure_case(model, inputs, Precision(torch.device("cpu"), dtype), progress=lambda m: None)
    result.pop("timing")
    name = f"{engine}-{str(dtype)[6:]}"
    assert _differences(_clean(result), GOLDEN[name], 1e-12 if dtype == torch.float64 else 1e-4, name) == []
