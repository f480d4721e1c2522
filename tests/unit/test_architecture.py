"""The package's wings stay layered: every module imports alone, no wing imports one above it, and
no two modules import each other (docs/architecture.md draws the layers)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import tiny_llm

PACKAGE = Path(tiny_llm.__file__).resolve().parent

LAYERS = [
    {
        "architectures",
        "config",
        "declared",
        "distributed",
        "io",
        "layout",
        "lazy",
        "provenance",
        "registry",
        "runtime",
        "shapes",
    },
    {"model", "data"},
    {"training"},
    {"curvature"},
    {"workers", "results"},
    {"geometry"},
    {"campaign"},
    {"cli", "commands"},
]
"""Bottom to top: a module may import from its own wing and from wings of lower layers only."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            inside |= {id(n) for statement in node.body for n in ast.walk(statement)}
    return inside


def _imports(path: Path, runtime: bool = False) -> set[str]:
    """tiny_llm modules imported anywhere in the file (inside functions too); ``runtime``: only
    those imported when the code runs (not for annotations under ``if TYPE_CHECKING:``)."""
    found = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree) if runtime else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tiny_llm"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("tiny_llm")}
    return found


def _wing(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _layer(wing: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if wing in names)


def test_every_wing_has_a_layer_and_a_docstring_and_reexports_its_names():
    for module, path in _modules().items():
        if module == "tiny_llm":
            continue
        _layer(_wing(module))  # StopIteration: a new wing needs a place in LAYERS (and the docs)
        if path.name == "__init__.py":
            package = __import__(module, fromlist=["__all__"])
            assert package.__doc__ and len(package.__doc__.split()) > 15, module
            assert package.__all__ and all(hasattr(package, name) for name in package.__all__), module


def test_no_wing_imports_a_wing_above_it():
    for module, path in _modules().items():
        if module == "tiny_llm":  # the top package re-exports the public API
            continue
        for target in _imports(path):
            assert _layer(_wing(target)) <= _layer(_wing(module)), f"{module} imports {target}, a layer above it"


def test_no_import_cycles_between_modules():
    """Strict: an import for annotations only (``if TYPE_CHECKING:``) counts as an import too, so
    no part can be typed with the type of what holds it."""
    modules = _modules()
    graph = {module: {t for t in _imports(path) if t in modules and t != module} for module, path in modules.items()}
    # a package's __init__ re-exports its own modules: that edge is not a cycle
    graph = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            assert state.get(target) != 1, f"import cycle: {' -> '.join(trail + [module, target])}"
            if target not in state:
                visit(target, trail + [module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_every_module_imports_first_and_alone():
    """Each module imported as the first tiny_llm module of a process (torch already loaded), so an
    import that works only after another one fails here."""
    code = (
        "import sys, importlib, torch\n"
        f"for name in {sorted(_modules())!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'tiny_llm' or m.startswith('tiny_llm.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_every_tiny_llm_import_outside_the_package_resolves():
    """The workflow's rules and scripts, the benchmarks and the GPU check import names that exist
    (a moved module fails here, not on the cluster or the GPU node)."""
    repo = PACKAGE.parents[1]
    files = [
        *repo.glob("workflow/rules/*.smk"),
        *repo.glob("workflow/scripts/*.py"),
        *repo.glob("benchmarks/*.py"),
        *repo.glob("benchmarks/*.sh"),
        *repo.glob("tests/**/*.py"),
    ]
    statements = set()
    for path in files:
        text = re.sub(r"\(\s*([^)]*?)\s*\)", lambda m: " ".join(m.group(1).split()).rstrip(","), path.read_text())
        statements |= set(
            re.findall(r"^\s*(from tiny_llm[\w.]* import [\w, ]+|import tiny_llm[\w.]*(?: as \w+)?)", text, re.M)
        )
    assert len(statements) > 50
    for statement in sorted(statements):
        exec(statement, {})


def test_the_command_line_parses_without_importing_torch():
    """``tiny-llm --help`` (and every subcommand's) builds its parser without torch, so it answers at
    once; the commands import what they run, and ``tiny_llm.Llama`` is still there on first use."""
    code = (
        "import sys, tiny_llm, tiny_llm.cli as cli; parser = cli._parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert tiny_llm.Llama.__name__ == 'Llama' and 'torch' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_planner_plans_every_shipped_configuration_without_torch():
    """The workflow's start-up (the Snakefile's imports, the plan of each shipped configuration, its
    targets, memory plans and costs) imports no torch, matplotlib or pandas: parameter shapes come
    from the architectures' declarations, job resolution from ``workers.resolution``, figure names
    from ``layout``."""
    repo = PACKAGE.parents[1]
    code = (
        "import sys, yaml\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'matplotlib', 'pandas'):\n"
        "            raise ImportError('the planner imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tiny_llm.campaign import jobs, slurm_jobs\n"
        "from tiny_llm.campaign.checks import schema_errors\n"
        "from tiny_llm.campaign.targets import all_targets\n"
        "from tiny_llm.campaign.workflow import WorkflowPlan\n"
        "from tiny_llm.layout import FIGURES\n"
        "from tiny_llm.results.record import append_event\n"
        "for name in ('config.yaml', 'naiss.yaml', 'seeds-demo.yaml'):\n"
        "    WorkflowPlan(yaml.safe_load(open('config/' + name)))\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_file_layout_is_spelled_in_one_module():
    """Run and result file names live in tiny_llm.layout: no other module spells them as literals,
    and the workflow's rules write the result paths it names."""
    from tiny_llm import layout

    names = [
        layout.RESOLVED,
        layout.IMPORTED,
        layout.TRAIN_LOG,
        layout.FINAL,
        layout.RESUME,
        layout.SUMMARY,
        layout.MANIFEST,
        layout.STATES,
        layout.SPECTRUM,
    ]
    for module, path in _modules().items():
        if module == "tiny_llm.layout":
            continue
        code = "\n".join(
            line
            for line in path.read_text().splitlines()
            if not line.lstrip().startswith(("#", '"""')) and "help=" not in line
        )
        for name in names:
            assert f'"{name}"' not in code, f"{module} spells {name!r}; use tiny_llm.layout"
        assert 'f"epoch-{' not in code, f"{module} formats an epoch file name; use layout.epoch_file"
    rules = "\n".join(p.read_text() for p in (PACKAGE.parents[1] / "workflow/rules").glob("*.smk"))
    for pattern in (layout.STATE_RESULT, layout.STATE_DONE, layout.SPECTRUM_RESULT):
        assert f'"{pattern}"' in rules, pattern
