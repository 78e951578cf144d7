"""The examples of README.md and docs/*.md run as written: every ```bash and ```python block, at a tiny size.

A document's blocks run in one scratch directory standing for the checkout (``train_multitask.py`` and ``data/``
there are links, ``data/`` to tests/conftest.py's tiny data), as a reader runs them after ``source
.venv/bin/activate``: the suite's python first on the PATH, one thread, no GPU. Each command line of a bash block runs
in bash, a train command with TINY's flags appended (the tiny model, a batch a task, one epoch); then each python block
runs as a script: the commands make the runs that the Python reads (the README's Predictor reads "Adding a task"'s).
BEFORE makes what the document assumes a reader already has. A block that cannot run here carries a marker on the
line right above it, an HTML comment the reader does not see:

    <!-- not run: why -->                          the whole block
    <!-- not run `piece`: why; `piece`: why -->    the block's lines that hold a piece

Anything else that does not exit 0 fails the test, naming the document's line and the command's last words.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The flags that make a command tiny, by the first piece of its line found here: the tiny model, a batch of each
# task (32, the default batch size) for one epoch, no priors (they are MiniLM's).
_TRAIN = "--limit 32 --epochs 1 --max-length 32 --sst-prior 0 --sts-prior 0"
TINY = [
    ("--eval-only", ""),  # evaluation keeps the saved run's settings: tiny already
    ("tasks.robustness few-shot", f"--pretrained {{model}} {_TRAIN}"),  # after its --; its --sst-phrases is its own
    ("tasks.robustness attack", "--limit 32"),
    ("tasks.pretrain", "--pretrained {model} --max-sentences 16 --eval-sentences 8 --epochs 1 --batch-size 8 "
                       "--max-length 32"),
    ("train_multitask.py", f"--pretrained {{model}} {_TRAIN} --sst-phrases none"),
]
# What a document's blocks take as already there: the README's first block (`make train`, not run) trains
# runs/default; runs/a, runs/b and runs/c stand for a reader's runs to ensemble, pairs.txt for their pairs.
BEFORE = {
    "README.md": ["python train_multitask.py --out-dir runs/default",
                  "cp -r runs/default runs/a", "cp -r runs/default runs/b", "cp -r runs/default runs/c",
                  r"printf 'A man sleeps.\tA person rests.\n' > pairs.txt"],
}


@dataclass
class Block:
    """A fenced block of a document: its language, first line (1-based, the fence's), lines and marker."""

    language: str
    line: int
    lines: list[str]
    marker: str | None  # the text of a `<!-- not run... -->` right above it


def blocks(document: Path) -> list[Block]:
    """The ```bash and ```python blocks of ``document``, in order."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        if line in ("```bash", "```python"):
            marker = re.fullmatch(r"<!-- (not run.*) -->", lines[i - 1]) if i else None
            end = lines.index("```", i + 1)
            found.append(Block(line[3:], i + 1, lines[i + 1:end], marker and marker[1]))
    return found


def not_run(block: Block) -> dict[str, str]:
    """Why the block's marker skips lines: {piece of a line: why}, {"": why} for the whole block, {} unmarked."""
    if block.marker is None:
        return {}
    if whole := re.fullmatch(r"not run: (.+)", block.marker):
        return {"": whole[1]}
    pieces = dict(re.findall(r"`([^`]+)`: ([^;]+)", block.marker))
    assert pieces, f"line {block.line - 1}: a marker is `not run: why` or `not run `piece`: why`: {block.marker!r}"
    return pieces


def tiny(command: str, model: Path) -> str:
    """``command`` at the tiny size."""
    flags = next((flags for piece, flags in TINY if piece in command), "")
    return f"{command} {flags.format(model=model)}".strip()


def run_document(document: Path, scratch: Path, env_dirs: tuple[Path, Path]) -> list[str]:
    """Run the blocks of ``document`` in ``scratch``; fail on the first command that does not exit 0. Returns a line
    for each command or block: that it ran, or why its marker skips it."""
    model, data = env_dirs
    (scratch / "train_multitask.py").symlink_to(ROOT / "train_multitask.py")
    (scratch / "data").symlink_to(data)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MINBERT_PLUGINS", None)
    name = os.path.relpath(document, ROOT)

    def run(argv: list[str], where: str) -> None:
        proc = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            last = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            pytest.fail(f"{where} exited {proc.returncode}:\n{last}", pytrace=False)

    def bash(command: str, where: str) -> None:
        run(["bash", "-o", "pipefail", "-c", tiny(command, model)], f"{where} {command}")

    done = []
    for command in BEFORE.get(document.name, []):
        bash(command, f"{name}, before its blocks:")
    found = blocks(document)
    for block in [b for b in found if b.language == "bash"] + [b for b in found if b.language == "python"]:
        skip = not_run(block)
        if "" in skip:
            done.append(f"{name}:{block.line} not run: {skip['']}")
        elif block.language == "python":
            run([sys.executable, "-c", "\n".join(block.lines)], f"{name}:{block.line} (python)")
            done.append(f"{name}:{block.line} ran (python)")
        else:
            used = set()
            for n, line in enumerate(block.lines, block.line + 1):
                command = line.split("  #")[0].strip()
                if not command or command.startswith("#"):
                    continue
                if piece := next((p for p in skip if p in command), None):
                    used.add(piece)
                    done.append(f"{name}:{n} not run: {skip[piece]}")
                    continue
                bash(command, f"{name}:{n}")
                done.append(f"{name}:{n} ran: {command}")
            assert used == set(skip), f"{name}:{block.line}: the marker names {sorted(set(skip) - used)}, no line here"
    return done


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_each_example_runs_as_written_or_says_why_not(document, tiny_env, tmp_path):
    """Every command line and Python block of the document exits 0 at the tiny size, in the document's order, unless a
    marker above its block says why it cannot run here; a marker names only lines its block has."""
    done = run_document(document, tmp_path, tiny_env)
    print("\n".join(done))
    assert any(" ran" in line for line in done)


def test_a_failing_example_fails_unless_marked(tmp_path):
    """On planted documents: a marked block or line does not run, an unmarked command that fails fails the test naming
    its document's line, a marker naming a line its block lacks fails, and a train command gets the tiny flags."""
    marked = tmp_path / "marked.md"
    marked.write_text("<!-- not run: planted -->\n```bash\nfalse\n```\n"
                      "<!-- not run `exit 3`: planted too -->\n```bash\nprintf 'ok\\n'  # a comment\nexit 3\n```\n")
    (tmp_path / "a").mkdir()
    name = os.path.relpath(marked, ROOT)
    assert run_document(marked, tmp_path / "a", (tmp_path, tmp_path)) == [
        f"{name}:2 not run: planted", f"{name}:7 ran: printf 'ok\\n'", f"{name}:8 not run: planted too"]
    broken = tmp_path / "broken.md"
    broken.write_text("text\n\n```bash\nprintf 'ok\\n'\nexit 3\n```\n")
    (tmp_path / "b").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"broken\.md:5 exit 3 exited 3"):
        run_document(broken, tmp_path / "b", (tmp_path, tmp_path))
    stale = tmp_path / "stale.md"
    stale.write_text("<!-- not run `nothing like it`: planted -->\n```bash\nprintf 'ok\\n'\n```\n")
    (tmp_path / "c").mkdir()
    with pytest.raises(AssertionError, match="the marker names"):
        run_document(stale, tmp_path / "c", (tmp_path, tmp_path))
    assert tiny("python train_multitask.py --out-dir x", Path("m")) == (
        f"python train_multitask.py --out-dir x --pretrained m {_TRAIN} --sst-phrases none")
