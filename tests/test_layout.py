"""The shape of the code: the import graph is a tree, no module reaches into another's privates, commands apart,
one device policy, no host reads in the hot path.

The graph is built from the source with ``ast`` (imports inside functions
count too), over every module of minbert/, tasks/, experiments/, benchmarks/
and train_multitask.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tasks.objectives import REGISTRY, import_all

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


def shared_names(modules: dict[str, Path]) -> dict[str, list[str]]:
    """File names (packages' __init__.py aside) that more than one of the project's modules has."""
    by_name: dict[str, list[str]] = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(name)
    return {file: sorted(names) for file, names in by_name.items() if len(names) > 1}


def test_no_two_modules_share_a_file_name():
    """A file name says which module it is: an editor's tab, a traceback's line, a test's mirror (there were two
    ensemble.py, robustness.py, mlm.py, config.py and sst_phrases.py)."""
    assert shared_names(_modules()) == {}


def test_the_name_scan_finds_a_planted_twin():
    modules = _modules()
    assert shared_names({**modules, "tasks.data.trainer": ROOT / "tasks" / "data" / "trainer.py"}) == {
        "trainer.py": ["tasks.data.trainer", "tasks.training.trainer"]}


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


COMMANDS = {"tasks.train", "tasks.predict", "tasks.ensemble", "tasks.pretrain", "tasks.robustness", "tasks.sst_phrases"}
# What runs a command as a program: the script train_multitask.py and the console scripts of pyproject.toml.
SCRIPTS = {"train_multitask", "tasks.scripts"}
FLAG_MODULES = {"tasks.options", "tasks.cli", "tasks.arguments"}  # the mechanism, the parser, the train flags


def command_importers(modules: dict[str, Path]) -> list[str]:
    """Modules that import a command (the scripts that run them, SCRIPTS, aside)."""
    found = []
    for name, path in modules.items():
        deps, _ = _imports(name, path, modules)
        if deps & COMMANDS and name not in SCRIPTS:
            found.append(name)
    return found


def argparse_users(modules: dict[str, Path]) -> list[str]:
    """Modules of minbert/ and tasks/ outside the commands and the flag mechanism that import argparse."""
    return [name for name, path in modules.items() if name.split(".")[0] in ("tasks", "minbert")
            and name not in COMMANDS | FLAG_MODULES and "import argparse" in path.read_text(encoding="utf-8")]


def test_no_module_imports_a_command():
    """Commands live apart (fairseq_cli/ and fairseq/): no module, library or script, imports one (the robustness
    command and four experiments once imported the train command's parsing, the ensemble experiment its main)."""
    assert command_importers(_modules()) == []


def test_library_modules_do_not_parse_flags():
    """Flags are made in one place (tasks.options, with tasks.arguments for train_multitask.py): no other library
    module imports argparse."""
    assert argparse_users(_modules()) == []


def test_the_command_scan_finds_a_planted_import(tmp_path):
    lib = tmp_path / "lib.py"
    lib.write_text("from tasks.predict import main\nimport argparse\n")
    modules = {"tasks.training.lib": lib, "tasks.predict": ROOT / "tasks/predict.py"}
    assert command_importers(modules) == ["tasks.training.lib"] and argparse_users(modules) == ["tasks.training.lib"]


def script_parsers() -> list[str]:
    """The experiment and benchmark scripts that take flags: each builds its parser in ``build_parser()``."""
    return [name for name, path in _modules().items() if name.split(".")[0] in ("experiments", "benchmarks")
            and "\ndef build_parser(" in path.read_text(encoding="utf-8")]


def _parsers():
    """(name, parser) of every command, of the subcommands of tasks.robustness, and of every experiment and
    benchmark script."""
    import argparse
    import importlib

    from tasks import arguments, ensemble, predict, pretrain, robustness, sst_phrases

    out = [("train_multitask.py", arguments.build_parser()), ("tasks.predict", predict.build_parser()),
           ("tasks.ensemble", ensemble.build_parser()), ("tasks.pretrain", pretrain.build_parser()),
           ("tasks.sst_phrases", sst_phrases.build_parser())]
    for action in robustness.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"tasks.robustness {n}", p) for n, p in action.choices.items()]
    out += [(name, importlib.import_module(name).build_parser()) for name in script_parsers()]
    return out


def hand_made_flags(modules: dict[str, Path]) -> list[str]:
    """"file:line" of every ``add_argument`` call outside the mechanism (tasks.options): a flag made by hand has no
    field, so its default, help and type would be written a second time, where no test of the fields sees them."""
    found = []
    for name, path in modules.items():
        if name == "tasks.options":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}")
    return found


def test_no_flag_is_made_outside_the_mechanism():
    """No command, experiment or benchmark calls add_argument itself: every flag comes from a dataclass field
    through tasks.options.add_options."""
    assert hand_made_flags(_modules()) == []


def test_the_flag_scan_finds_a_planted_flag(tmp_path):
    script = tmp_path / "script.py"
    script.write_text('"""p.add_argument("--in-a-docstring")"""\np = Parser()\ng = p.add_argument_group("x")\n'
                      'g.add_argument("--x", type=int)\n')
    assert hand_made_flags({"experiments.script": script}) == ["script.py:4"]


def test_every_flag_of_every_command_comes_from_a_dataclass_field():
    """Each flag of each command was made by tasks.options.add_options from a field of a dataclass (TrainConfig,
    ModelConfig, an objective's Config, PretrainConfig, a command's own), so its type, choices, help and default
    are written once, beside the setting."""
    import argparse
    import dataclasses

    found = {}
    for name, parser in _parsers():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            field = getattr(action, "field", None)
            if field is None or field[1] not in {f.name for f in dataclasses.fields(field[0])}:
                found.setdefault(name, []).append(action.option_strings or [action.dest])
    assert found == {}
    assert len(_parsers()) == 9 + 15


def test_no_commands_help_names_a_path_outside_the_checkout():
    """A clone from a public host has no ../shared beside it: no --help points there (papers are cited by title)."""
    assert [name for name, parser in _parsers() if "../" in parser.format_help()] == []


# ---- one device policy -------------------------------------------------------------------------------------------

DEVICE_PATTERNS = ("torch.cuda.", "device.type ==", "device.type !=", ".is_cuda")
# Files allowed to test the device themselves, and why.
DEVICE_EXCEPTIONS = {
    # The device policy itself.
    "tasks/runtime.py": "the one module of device decisions",
    # The encoder's own kernel choices (SDPA vs the math path with a cheaper dropout mask on CPU, the
    # padding fast path): minbert knows nothing of tasks/ (DESIGN.md), so it cannot ask tasks.runtime.
    "minbert/bert.py": "the encoder's kernels; minbert may not import tasks",
}


def device_tests(text: str) -> list[str]:
    """The lines of ``text`` that test or call the device themselves (DEVICE_PATTERNS)."""
    return [line.strip() for line in text.splitlines() if any(p in line for p in DEVICE_PATTERNS)]


def test_device_decisions_live_in_runtime():
    """No module outside DEVICE_EXCEPTIONS calls torch.cuda or compares a device type: pinning,
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


# ---- no host reads in the hot path: a source scan ----------------------------------------------------------------
# The forms without a host read are checked against direct formulas that read the device in
# tests/objectives/test_scl.py, test_distill.py and tests/minbert/test_mlm.py; tests/objectives/test_init.py runs
# every objective on the meta device, where a host read raises.


ALLOW = "# host-read:"  # end-of-line marker of an allowed read, followed by its reason
HOST_METHODS = {"item", "tolist", "numpy", "cpu"}
HOST_CASTS = {"int", "float", "bool"}


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return isinstance(node, ast.Constant)


def host_reads(fn: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each host read in a function: .item() / .tolist() / .numpy() / .cpu(), int( / float( /
    bool( of anything but a literal, and torch.tensor(..., device=...) (a host-to-device copy)."""
    found = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in HOST_METHODS:
            found.append((node.lineno, f".{f.attr}()"))
        elif isinstance(f, ast.Name) and f.id in HOST_CASTS and node.args and not all(map(_literal, node.args)):
            found.append((node.lineno, f"{f.id}(...)"))
        elif (isinstance(f, ast.Attribute) and f.attr == "tensor" and isinstance(f.value, ast.Name)
              and f.value.id == "torch" and any(k.arg == "device" for k in node.keywords)):
            found.append((node.lineno, "torch.tensor(..., device=...)"))
    return found


def hot_functions(root: Path = ROOT) -> list[tuple[Path, str, ast.AST]]:
    """(file, qualified name, node) of every function a training step runs: AdamW's ``step`` methods
    (minbert/optimizer.py), every ``forward`` of a class under tasks/objectives/, and every function named
    ``train_step`` or ``step_loss`` anywhere under tasks/ (found by name, wherever the training loop lives);
    with each, the module-level functions of the same file that it calls by name, and the module-level dicts it
    reads with the functions they name (an objective's rules by kind of task), transitively (the fused update,
    the loss functions), named ``caller -> helper``."""
    out = []
    for path in [root / "minbert" / "optimizer.py", *sorted((root / "tasks").rglob("*.py"))]:
        tree = ast.parse(path.read_text(), filename=str(path))
        objectives = "objectives" in path.relative_to(root).parts
        roots = []
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        (path.name == "optimizer.py" and fn.name == "step") or (objectives and fn.name == "forward")):
                    roots.append((f"{cls.name}.{fn.name}", fn))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in ("train_step", "step_loss"):
                roots.append((fn.name, fn))
        helpers = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        tables = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
                  for t in n.targets if isinstance(t, ast.Name)}
        for name, fn in roots:
            out.append((path, name, fn))
            todo, seen = [(fn, False)], set()
            while todo:
                node, in_table = todo.pop()
                for ref in ast.walk(node):
                    called = isinstance(ref, ast.Call) and isinstance(ref.func, ast.Name) and ref.func.id
                    named = isinstance(ref, ast.Name) and isinstance(ref.ctx, ast.Load) and ref.id
                    for what, table in ((called, False), (named if in_table else None, False), (named, True)):
                        found = (tables if table else helpers).get(what) if what else None
                        if found is not None and what not in seen:
                            seen.add(what)
                            todo.append((found, table))
                            out.append((path, f"{name} -> {what}", found))
    return out


def offending_lines(root: Path = ROOT) -> list[str]:
    """file:line (function: what) of every host read in the hot functions not marked ``# host-read: <reason>``."""
    bad = []
    for path, name, fn in hot_functions(root):
        lines = path.read_text().splitlines()
        for line, what in host_reads(fn):
            text = lines[line - 1]
            reason = text.split(ALLOW, 1)[1].strip() if ALLOW in text else ""
            if not reason:
                bad.append(f"{path.relative_to(root)}:{line} ({name}: {what})")
    return sorted(set(bad))


def test_hot_path_source_has_no_unmarked_host_reads():
    """No host read in the optimizer step, the objectives' forwards, train_step or step_loss, except lines marked
    ``# host-read: <reason>``. The scan finds what it must scan (not vacuous if files move)."""
    found = {(p.name, name) for p, name, _ in hot_functions()}
    assert ("optimizer.py", "AdamW.step") in found
    assert {"train_step", "step_loss"} <= {name for _, name, _ in hot_functions()}
    import_all()
    for cls in REGISTRY.values():
        module = Path(__import__(cls.__module__, fromlist=["_"]).__file__).name
        assert (module, f"{cls.__name__}.forward") in found, cls.__name__
    assert offending_lines() == []


def test_source_scan_catches_each_kind_of_host_read(tmp_path):
    """The scan flags .item(), .tolist(), int/float/bool of a non-literal, torch.tensor(..., device=...), lists them
    as file:line, accepts a line marked with a reason and refuses the marker without one."""
    tree = copy_tree(tmp_path)
    target = tree / "tasks" / "objectives" / "scl.py"
    source = target.read_text()
    anchor = "        key = self.config.embedding\n"
    assert anchor in source
    injected = ("        a = out.features[key].sum().item()\n"
                "        b = batch['labels'].tolist()\n"
                "        c = int(batch['labels'].sum())\n"
                "        d = float(3) + bool(0) + int(-1)\n"
                "        e = torch.tensor(1.0, device=batch['labels'].device)\n"
                "        f = bool(batch['labels'].any())  # host-read: a test says why\n"
                "        g = float(batch['labels'].max())  # host-read:\n")
    target.write_text(source.replace(anchor, anchor + injected, 1))
    first = source[:source.index(anchor)].count("\n") + 2  # line of the first injected statement
    bad = offending_lines(tree)
    path = "tasks/objectives/scl.py"
    assert bad == sorted([f"{path}:{first} (SupervisedContrastive.forward: .item())",
                          f"{path}:{first + 1} (SupervisedContrastive.forward: .tolist())",
                          f"{path}:{first + 2} (SupervisedContrastive.forward: int(...))",
                          f"{path}:{first + 4} (SupervisedContrastive.forward: torch.tensor(..., device=...))",
                          f"{path}:{first + 6} (SupervisedContrastive.forward: float(...))"])


def copy_tree(tmp_path: Path) -> Path:
    """A copy of minbert/ and tasks/ (python sources only) under tmp_path, to scan edited versions of."""
    import shutil

    for package in ("minbert", "tasks"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


# ---- tests mirror the package -------------------------------------------------------------------------------------

TESTS = ROOT / "tests"
WHOLE_CHECKOUT = {"test_layout.py", "test_readme.py"}  # the tests of the checkout's shape and of its documents


def mirrored_module(test_file: Path) -> Path:
    """The module a test file tests: tests/test_x.py -> tasks/x.py, tests/minbert/test_x.py -> minbert/x.py,
    tests/<dir>/test_x.py -> tasks/<dir>/x.py (experiments/ and benchmarks/ at the top), test_init -> __init__."""
    rel = test_file.relative_to(TESTS)
    name = ("__init__" if rel.stem == "test_init" else rel.stem.removeprefix("test_")) + ".py"
    if len(rel.parts) == 1:
        return ROOT / "tasks" / name
    top = rel.parts[0]
    return ROOT / (top if top in ("minbert", "experiments", "benchmarks") else f"tasks/{top}") / name


def test_every_test_file_mirrors_a_module_and_every_module_has_one():
    """tests/training/test_trainer.py tests tasks/training/trainer.py (STYLE.md principle 17): no test file named
    after a work item, no module of minbert/ or tasks/ without its test file; WHOLE_CHECKOUT's test no module."""
    test_files = [p for p in TESTS.rglob("test_*.py") if p.name not in WHOLE_CHECKOUT]
    assert [str(p.relative_to(ROOT)) for p in test_files if not mirrored_module(p).is_file()] == []
    mirrored = {mirrored_module(p) for p in test_files}
    modules = [p for package in ("minbert", "tasks") for p in (ROOT / package).rglob("*.py")
               if p.name != "__init__.py" or p.parent.name == "objectives"]
    untested = sorted(str(p.relative_to(ROOT)) for p in modules if p not in mirrored)
    assert untested == []


def test_no_test_file_imports_another_test_module():
    """Shared fixtures live in tests/conftest.py and shared helpers in tests/helpers.py; a test module imported by
    another (``from tests.test_train import tiny_env  # noqa``) is a hidden dependency between test files."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.startswith("tests.") and n.split(".")[-1].startswith("test_")]
    assert found == []


# ---- the README as a newcomer follows it ----------------------------------------------------------------------------


def _readme_commands() -> list[str]:
    """The command lines of README.md's bash blocks (comments and continuation lines joined away)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_opens_with_two_commands_and_the_rest_run_as_written_after_them():
    """A newcomer runs the first block's two commands (the main job and the tests, each setting up on first use);
    every later command is the plain form the activated .venv runs: its python, torchrun, tensorboard, hf, pip,
    or a console script pyproject.toml installs (a bare `python` is the system's in a fresh clone: nothing before it
    activates .venv). CI runs the README's test command as written."""
    import tomllib

    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    first = [line.split("  #")[0].strip() for line in blocks[0].splitlines()]
    assert first == ["make train", "make test"]
    commands = _readme_commands()
    assert len(commands) > 15
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    tools = {"make", "python", "torchrun", "tensorboard", "hf", "pip", "bash"} | scripts
    programs = [part.split()[0] for c in commands for part in c.split("|")]
    assert [p for p in programs if p not in tools and p != "printf"] == []
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`source .venv/bin/activate` once per shell and every command below runs as written" in text
    assert ".venv/bin/python" not in text and "../shared" not in text
    assert [n for n in re.findall(r"`(minbert-[a-z-]+)`", text) if n not in scripts] == []
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci


def test_the_readme_fits_250_lines():
    """The README is the front page, not a lab notebook: figures live in RESULTS.md and benchmarks/README.md."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_setup_says_what_it_is_doing_before_each_long_step():
    """setup.sh announces each install (and the virtualenv) before it starts: together they take minutes."""
    lines = (ROOT / "setup.sh").read_text().splitlines()
    long_steps = [i for i, line in enumerate(lines) if re.search(r"-m venv|\$PIP install", line)]
    assert len(long_steps) == 4
    assert all(lines[i - 1].strip().startswith('echo "setup.sh: ') for i in long_steps), [lines[i] for i in long_steps]


def test_make_sets_up_on_first_use_and_says_so_when_it_is_done(tmp_path):
    """The README's two commands run setup.sh when .venv has not been set up, or a file it installs from is
    newer than its last success, and otherwise say in one line that the set-up is done (setup.sh replaced here
    by a stand-in that leaves the stamp the real one leaves)."""
    import os
    import subprocess

    for name in ("Makefile", "pyproject.toml", "requirements.txt", "requirements-test.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "setup.sh").write_text("echo SETUP RAN\nmkdir -p .venv/bin\ntouch .venv/.setup-done\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("#!/bin/sh\necho RAN \"$@\"\n")
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)

    # run under `make test`, the suite inherits its command-line variables (ARGS) through MAKEFLAGS: not these makes
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}

    def make(*args: str) -> str:
        return subprocess.run(["make", "-s", *args], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env=env).stdout

    assert make("test").splitlines() == ["SETUP RAN", "RAN -m pytest -q -n auto --maxprocesses 4 --dist loadfile"]
    assert make("train", "ARGS=--limit 64").splitlines() == [
        "make: set-up already done (.venv is newer than setup.sh pyproject.toml requirements.txt "
        "requirements-test.txt; bash setup.sh redoes it)", "RAN train_multitask.py --limit 64"]
    stamp = os.stat(tmp_path / ".venv" / ".setup-done").st_mtime
    os.utime(tmp_path / "pyproject.toml", (stamp + 5, stamp + 5))
    assert make("test").splitlines()[0] == "SETUP RAN"
