"""A package's names imported on first use: the module of each name only when it is asked for."""

import subprocess
import sys

import pytest

from tiny_llm.lazy import exports


def test_a_name_imports_its_module_on_first_use(tmp_path, monkeypatch):
    """Modules of the test's own (never the standard library's, which other tests share)."""
    (tmp_path / "lazy_probe_a.py").write_text("class Thing:\n    pass\n")
    (tmp_path / "lazy_probe_b.py").write_text("def helper():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names, getattr_ = exports("pkg", {"lazy_probe_a": ["Thing"], "lazy_probe_b": ["helper"]})
    assert names == ["Thing", "helper"] and "lazy_probe_a" not in sys.modules
    assert getattr_("Thing").__name__ == "Thing" and "lazy_probe_a" in sys.modules
    assert "lazy_probe_b" not in sys.modules
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'other'"):
        getattr_("other")
    for name in ("lazy_probe_a", "lazy_probe_b"):
        sys.modules.pop(name, None)


def test_the_wings_import_without_their_heavy_kin():
    """Importing a wing does not import its modules until a name is used."""
    code = "import sys, tiny_llm.geometry, tiny_llm.workers, tiny_llm.curvature; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
