"""Every user-caused error ends in one line, the right exit status, and an untouched run directory (issue 15).

One table: each case damages an input (a data file, a checkpoint file, a flag, the disk), runs the CLI
(tasks.cli.main in-process, or ``python train_multitask.py`` in a subprocess) against a copy of a finished
run, and checks the exit status (2: found while checking the arguments; 1: found at run time), that the last
line of stderr is ``<program>: error: <message naming the file or flag>`` with no traceback, and that no file
of the existing run directory changed (train.log aside: it logs the failed attempt by design).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import train as cli
from tasks.training import checkpoint as ckpt_mod
from tasks.training import trainer as trainer_mod
from tests.test_run_dir import snapshot
from tests.test_train import tiny_env  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def _flags(env, out_dir: Path, data: Path | None = None) -> list[str]:
    pretrained, tiny_data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data or tiny_data), "--out-dir", str(out_dir),
            "--device", "cpu", "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32",
            "--fcn-size", "16", "--lr", "1e-3", "--log-every", "2", "--epochs", "1"]


@pytest.fixture(scope="module")
def finished(tiny_env, tmp_path_factory):
    """A finished one-epoch run made by the CLI (copied by each case, never changed)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cli.main(_flags(tiny_env, out))
    return out


def _bad_data(env, tmp: Path, name: str, edit) -> Path:
    data = tmp / "data"
    shutil.copytree(env[1], data)
    path = data / name
    path.write_bytes(edit(path.read_bytes()))
    return data


def _damage(run: Path, names: list[str], edit) -> None:
    for name in names:
        path = run / "checkpoints" / name
        path.write_bytes(edit(path.read_bytes()))


def _truncate(b: bytes) -> bytes:
    return b[: len(b) // 2]


def _garbage(b: bytes) -> bytes:
    return b"\x00garbage" + b[10:]


def _live_lock(run: Path) -> None:
    (run / "run.lock").write_text(json.dumps({"pid": os.getppid(), "host": __import__("socket").gethostname()}))


def _disk_full(monkeypatch) -> None:
    def full(path, tensors, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trainer_mod, "save_tensors", full)


# (id, setup(env, tmp, run, monkeypatch) -> argv, exit status, pattern of the message, via)
CASES = [
    ("non-utf8 data", lambda e, t, r, m: _flags(e, r, _bad_data(e, t, "ids-sst-train.csv", lambda b: b.replace(
        b"good", b"g\xffod", 1))) + ["--overwrite"], 1, r"ids-sst-train\.csv: line \d+: bytes that are not UTF-8",
     "subprocess"),
    ("empty data file", lambda e, t, r, m: _flags(e, r, _bad_data(e, t, "sts-train.csv", lambda b: b""))
     + ["--overwrite"], 1, r"sts-train\.csv: the file is empty", "main"),
    ("missing column", lambda e, t, r, m: _flags(e, r, _bad_data(e, t, "quora-train.csv", lambda b: b.replace(
        b"is_duplicate", b"label", 1))) + ["--overwrite"], 1, r"quora-train\.csv: line 1: the header has no column",
     "main"),
    ("header-only file", lambda e, t, r, m: _flags(e, r, _bad_data(e, t, "sts-dev.csv", lambda b: b.split(
        b"\n")[0] + b"\n")) + ["--overwrite"], 1, r"sts-dev\.csv: has a header but no rows", "main"),
    ("truncated model.safetensors, --resume", lambda e, t, r, m: _damage(
        r, ["last/model.safetensors", "best/model.safetensors"], _truncate) or ["--resume", "--out-dir", str(r)],
     2, r"last/model\.safetensors is truncated or corrupted.*neither last\.old nor best", "subprocess"),
    ("corrupted state.json, --resume", lambda e, t, r, m: _damage(
        r, ["last/state.json", "best/state.json"], _garbage) or ["--resume", "--out-dir", str(r)],
     2, r"last/state\.json is truncated or corrupted", "main"),
    ("corrupted config.json, --resume", lambda e, t, r, m: _damage(
        r, ["last/config.json", "best/config.json"], _truncate) or ["--resume", "--out-dir", str(r)],
     2, r"last/config\.json is truncated or corrupted", "main"),
    ("truncated model.safetensors, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/model.safetensors"], _truncate) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/model\.safetensors is truncated or corrupted", "main"),
    ("corrupted state.json, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/state.json"], _garbage) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/state\.json is truncated or corrupted", "main"),
    ("corrupted config.json, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/config.json"], _garbage) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/config\.json is truncated or corrupted", "main"),
    ("--pretrained does not exist", lambda e, t, r, m: [*_flags(e, r), "--pretrained", str(t / "no-such-model"),
                                                        "--overwrite"], 2, r"no-such-model", "main"),
    ("--out-dir is a file", lambda e, t, r, m: _flags(e, r / "metrics.jsonl"), 2,
     r"--out-dir .*metrics\.jsonl is a file", "main"),
    ("--out-dir below a file", lambda e, t, r, m: _flags(e, r / "config.json" / "sub"), 2,
     r"config\.json is a file, so the directory cannot be created", "main"),
    ("--out-dir not writable", lambda e, t, r, m: m.setattr(ckpt_mod.os, "access", lambda *a, **k: False)
     or _flags(e, r) + ["--overwrite"], 2, r"--out-dir .* is not writable", "main"),
    ("--max-length above the positions", lambda e, t, r, m: [*_flags(e, r), "--max-length", "4096", "--overwrite"],
     2, r"--max-length 4096 is more than the 64 positions .*max_position_embeddings", "main"),
    ("finished run re-entered", lambda e, t, r, m: _flags(e, r), 1,
     r"holds an earlier run: resume it \(--resume\), pick another --out-dir, or pass --overwrite", "main"),
    ("run directory in use", lambda e, t, r, m: _live_lock(r) or _flags(e, r) + ["--overwrite"], 1,
     rf"in use by process {os.getppid()}", "main"),
    ("disk full", lambda e, t, r, m: _disk_full(m) or _flags(e, r) + ["--overwrite"], 1,
     r"disk full writing .*model\.safetensors: free space", "main"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_with_its_exit_status_and_changes_nothing(tiny_env, finished, tmp_path,
                                                                         monkeypatch, capsys, case):
    """See the module docstring; each case names the file or flag at fault."""
    _, setup, status, pattern, via = case
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    argv = setup(tiny_env, tmp_path, run_dir, monkeypatch)
    before = {k: v for k, v in snapshot(run_dir).items() if k != "train.log"}
    if via == "subprocess":
        proc = subprocess.run([sys.executable, str(ROOT / "train_multitask.py"), *argv], capture_output=True,
                              text=True, cwd=tmp_path, env={**os.environ, "MINBERT_VERBOSE": ""})
        code, err = proc.returncode, proc.stderr
    else:
        monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        code, err = exc.value.code, capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    assert code == status, err
    assert re.search(r"error: ", lines[-1]) and re.search(pattern, lines[-1]), lines[-1]
    assert {k: v for k, v in snapshot(run_dir).items() if k != "train.log"} == before


def test_verbose_keeps_the_traceback(tiny_env, finished, tmp_path, monkeypatch):
    """MINBERT_VERBOSE=1 lets the exception through for a bug report."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    monkeypatch.setenv("MINBERT_VERBOSE", "1")
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        cli.main(_flags(tiny_env, run_dir))


def test_resume_falls_back_from_a_damaged_last_to_best_with_a_warning(tiny_env, finished, tmp_path, caplog):
    """--resume with a truncated last/model.safetensors resumes from the intact best and says so."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    _damage(run_dir, ["last/model.safetensors"], _truncate)
    result = cli.main(["--resume", "--out-dir", str(run_dir)])
    assert "resuming from" in caplog.text and str(run_dir / "checkpoints" / "best") in caplog.text
    assert result["final"] and result["best_epoch"] == 1
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in records if not r.get("final")] == [1]


def test_pretrain_reports_a_bad_data_file_in_one_line(tiny_env, tmp_path, monkeypatch, capsys):
    """python -m tasks.pretrain: a non-UTF-8 data file is one line and exit status 1, not a traceback."""
    from tasks import pretrain

    data = _bad_data(tiny_env, tmp_path, "ids-sst-train.csv", lambda b: b.replace(b"good", b"g\xffod", 1))
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    with pytest.raises(SystemExit) as exc:
        pretrain.main(["--out-dir", str(tmp_path / "out"), "--pretrained", str(tiny_env[0]), "--data-dir", str(data),
                       "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--max-steps", "1",
                       "--device", "cpu"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" not in err
    assert re.search(r"tasks\.pretrain: error: .*ids-sst-train\.csv: line \d+: bytes that are not UTF-8",
                     err.strip().splitlines()[-1])


def test_a_full_disk_while_writing_tensors_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    """safetensors reports a failed write as a SafetensorError, not an OSError: it must still read "disk full
    writing <file>", not "truncated or corrupted: use another checkpoint" (what a full disk printed before)."""
    import torch
    from safetensors import SafetensorError

    from tasks.cli import describe

    def full(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt_mod, "save_file", full)
    path = tmp_path / "model.safetensors"
    with pytest.raises(OSError) as exc:
        ckpt_mod.save_tensors(path, {"w": torch.zeros(2)})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    assert describe(exc.value).startswith(f"disk full writing {path}: free space")
