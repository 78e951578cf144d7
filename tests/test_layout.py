"""The shape of the code: the import graph is a tree, no module reaches into another's privates, commands apart.

The graph is built from the source with ``ast`` (imports inside functions
count too), over every module of minbert/, tasks/, experiments/, benchmarks/
and train_multitask.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("minbert", "tasks", "experiments", "benchmarks")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for the project's own code."""
    found = {"train_multitask": ROOT / "train_multitask.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """(project modules ``name`` imports, "file:line name" for every private name it takes from one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    deps: set[str] = set()
    private: list[str] = []
    module_aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    deps.add(alias.name)
                    module_aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in (*PACKAGES, "train_multitask"):
                continue
            if node.module in modules:
                deps.add(node.module)
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:  # "from tasks import lpft": the submodule
                    deps.add(sub)
                    module_aliases[alias.asname or alias.name] = sub
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module_aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            private.append(f"{path.relative_to(ROOT)}:{node.lineno} {module_aliases[node.value.id]}.{node.attr}")
    deps.discard(name)
    return deps, private


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = _modules()
    graph, private = {}, []
    for name, path in modules.items():
        deps, priv = _imports(name, path, modules)
        graph[name] = deps
        private += priv
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (one per back edge)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_the_import_graph_has_no_cycle():
    """No project module imports itself back through others (swa <-> train was one)."""
    graph, _ = _graph()
    assert graph["tasks.training.run"], "the graph builder found no imports at all: it is broken"
    assert _cycles(graph) == []


def test_cycle_detection_finds_a_planted_cycle():
    """The checker itself: a two-module cycle and a three-module one are reported."""
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_no_module_takes_another_modules_private_names():
    """``from tasks.train import _means`` or ``lpft._x``: a private name is its module's own business."""
    _, private = _graph()
    assert private == []


def test_nothing_imports_a_script():
    """train_multitask.py is the CLI: library code never imports it."""
    graph, _ = _graph()
    assert [m for m, deps in graph.items() if "train_multitask" in deps] == []


def test_no_sys_path_edits():
    """The project is an installed package (pip install -e . in setup.sh): no script edits sys.path."""
    offenders = [str(p.relative_to(ROOT)) for p in [*_modules().values(), *(ROOT / "tests").rglob("*.py")]
                 if "sys.path.insert" in p.read_text(encoding="utf-8") and p.name != "test_layout.py"]
    assert offenders == []


COMMANDS = {"tasks.train", "tasks.predict", "tasks.ensemble", "tasks.pretrain", "tasks.robustness", "tasks.cli"}


def argparse_users(modules: dict[str, Path]) -> list[str]:
    """Modules of minbert/ and tasks/ outside COMMANDS that parse flags or import a command."""
    found = []
    for name, path in modules.items():
        if name.split(".")[0] not in ("tasks", "minbert") or name in COMMANDS:
            continue
        deps, _ = _imports(name, path, modules)
        text = path.read_text(encoding="utf-8")
        if "import argparse" in text or deps & COMMANDS:
            found.append(name)
    return found


def test_library_modules_neither_parse_flags_nor_call_a_command():
    """Commands (tasks.train, .predict, .ensemble, .pretrain, .robustness and their shared tasks.cli) live apart:
    no library module imports argparse or a command (a trainer importing the predict command was one)."""
    assert argparse_users(_modules()) == []


def test_the_command_scan_finds_a_planted_import(tmp_path):
    lib = tmp_path / "lib.py"
    lib.write_text("from tasks.predict import main\n")
    assert argparse_users({"tasks.training.lib": lib, "tasks.predict": ROOT / "tasks/predict.py"}) == [
        "tasks.training.lib"]


# ---- one device policy -------------------------------------------------------------------------------------------

DEVICE_PATTERNS = ("torch.cuda.", "device.type ==", "device.type !=", ".is_cuda")
# Files allowed to test the device themselves, and why.
DEVICE_EXCEPTIONS = {
    # The device policy itself.
    "tasks/training/runtime.py": "the one module of device decisions",
    # The encoder's own kernel choices (SDPA vs the math path with a cheaper dropout mask on CPU, the
    # padding fast path): minbert knows nothing of tasks/ (DESIGN.md), so it cannot ask tasks.runtime.
    "minbert/bert.py": "the encoder's kernels; minbert may not import tasks",
}


def device_tests(text: str) -> list[str]:
    """The lines of ``text`` that test or call the device themselves (DEVICE_PATTERNS)."""
    return [line.strip() for line in text.splitlines() if any(p in line for p in DEVICE_PATTERNS)]


def test_device_decisions_live_in_runtime():
    """No module outside DEVICE_EXCEPTIONS calls torch.cuda or compares a device type (issue 13): pinning,
    prefetching, backends, optimizer paths, RNG state, synchronization and peak memory ask tasks.runtime."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in DEVICE_EXCEPTIONS and (lines := device_tests(path.read_text())):
                found[rel] = lines
    assert found == {}


def test_the_device_scan_finds_a_planted_test():
    assert device_tests('x = 1\nif batch.device.type == "cuda":\n    torch.cuda.synchronize()\n') == [
        'if batch.device.type == "cuda":', "torch.cuda.synchronize()"]
    assert device_tests("pin = runtime.pin_and_prefetch(device)\n") == []
