"""A package's names imported on first use: the module of each name only when it is asked for."""

import sys

import pytest

from tiny_llm.lazy import exports


def test_a_name_imports_its_module_on_first_use():
    sys.modules.pop("json.decoder", None)
    names, getattr_ = exports("pkg", {"json.decoder": ["JSONDecoder"], "json": ["dumps"]})
    assert names == ["JSONDecoder", "dumps"] and "json.decoder" not in sys.modules
    assert getattr_("JSONDecoder").__name__ == "JSONDecoder" and "json.decoder" in sys.modules
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_the_packages_planner_modules_import_without_their_heavy_kin():
    """Importing a wing does not import its modules until a name is used."""
    code = "import sys, tiny_llm.geometry, tiny_llm.workers, tiny_llm.curvature; print('torch' in sys.modules)"
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
