"""Tests of tasks/training/distributed.py: torchrun-style data parallelism of the trainer, on CPU with gloo.

Two processes are started with torch.multiprocessing (the environment
torchrun would set: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), or with
torchrun itself for the CLI, on the tiny random BERT and synthetic data of
``tiny_env`` (tests/conftest.py). Each rank runs one intra-op thread.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from tasks import train as cli
from tasks.model import ModelConfig
from tasks import runtime
from tasks.training import distributed
from tasks.training.run import run, trainer_for
from tests.helpers import ROOT, Interrupt, StopAt, tiny_train_config

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_dropout(env, out_dir: Path, **overrides):
    """The tiny config without any dropout (one process and two then compute the same function), 2 epochs.

    Batch 10 over capped epochs of 45 SST and 41 STS examples: partial last
    batches of 5 (shards 3 + 2) and of 1 (rank 1's shard is empty). Mean pooling: the tiny random
    encoder's pooler output hardly varies between sentences (std ~3e-4), which left every STS score
    within ~2e-5 of the others and Pearson r at the mercy of rounding.
    """
    kw = dict(batch_size=10, max_train_examples={"sst": 45, "sts": 41}, encoder_dropout=0.0, log_every=3,
              model=ModelConfig(arch="b1", pair_encoding="cross", pooling="mean", fcn_size=16, head_dropout=0.0))
    return tiny_train_config(env, out_dir, **{**kw, **overrides})


def _watch_writes(root: Path) -> list[str]:
    """Record every file or directory a Python call creates, changes or removes under ``root`` (audit hooks)."""
    seen: list[str] = []
    root_s = str(root)

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            path, mode, flags = os.fspath(args[0]), args[1], args[2]
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else \
                bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))  # os.open: no mode string
            if writes and path.startswith(root_s):
                seen.append(f"open {mode or flags} {path}")
        elif event in ("os.mkdir", "os.remove", "os.rename", "os.replace", "os.rmdir", "shutil.rmtree",
                       "os.link", "os.symlink", "shutil.copyfile"):
            paths = [os.fspath(a) for a in args if isinstance(a, (str, os.PathLike))]
            if any(p.startswith(root_s) for p in paths):
                seen.append(f"{event} {paths}")

    sys.addaudithook(hook)
    return seen


def _worker(rank: int, world: int, port: int, job: str, env, root: Path) -> None:
    """One rank: set torchrun's variables, run ``job``, save what the test compares under ``root``/results."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    results = root / "results"
    try:
        if job == "parity":
            writes = _watch_writes(root / "ddp") if rank > 0 else []
            trainer = trainer_for(_no_dropout(env, root / "ddp"))
            trainer.fit()
            trainer.load_best()
            (results / f"rank{rank}.json").write_text(json.dumps({"history": trainer.history, "writes": writes}))
        elif job in ("resume", "resume_knn", "resume_nccl"):
            kw = {"checkpoint_every": 4}
            if job == "resume_nccl":  # one GPU per rank; deterministic kernels for a bit-exact resume on CUDA
                kw |= {"device": "cuda", "deterministic": True}
            if job == "resume_knn":  # queues of 20 keys: full after a few steps, so the order of keys matters
                kw |= {"objectives": {"knn_bert": {"m_most": 2, "m_least": 2, "queue_size": 20}}, "epochs": 1}
            full = trainer_for(tiny_train_config(env, root / "full", **kw))
            full.fit()
            cfg = tiny_train_config(env, root / "cut", **kw)
            try:
                trainer_for(cfg, hooks=[StopAt(step=9)]).fit()
            except Interrupt:
                pass
            resumed = trainer_for(cfg, resume_from=root / "cut" / "checkpoints" / "last")
            resumed.fit()
            save_file(resumed.model.state_dict(), str(results / f"resumed{rank}.safetensors"))
            for name, t in (("full", full), ("resumed", resumed)):
                if t.objectives:
                    save_file({k: v.contiguous() for k, v in t.objectives[0].state_dict().items()},
                              str(results / f"{name}-objective{rank}.safetensors"))
            trainer = full
        elif job == "objectives":
            writes = _watch_writes(root / "obj") if rank > 0 else []
            cfg = tiny_train_config(env, root / "obj", epochs=1, swa={"epochs": 1, "lr": 1e-4}, limit=24,
                                    objectives={"rift": {"proj_hidden": 16, "proj_dim": 8}, "smart": {}})
            from tasks.training import run as run_module
            built, build = [], run_module.build_trainer
            run_module.build_trainer = lambda *a, **k: built.append(build(*a, **k)) or built[-1]  # keep the trainer
            summary = run(cfg)
            (results / f"rank{rank}.json").write_text(json.dumps({"summary": summary, "writes": writes}))
            trainer = built[0]  # its model: what run() predicts with (after SWA)
        else:
            raise ValueError(job)
        save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()},
                  str(results / f"rank{rank}.safetensors"))
    finally:
        distributed.cleanup()


def _spawn(job: str, env, root: Path, world: int = 2) -> None:
    (root / "results").mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, _free_port(), job, env, root), nprocs=world, join=True)


def _files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


# ---- the trainer under two processes -----------------------------------------------------------------------


def test_two_processes_equal_one_process_with_the_same_global_batch(tiny_env, tmp_path):
    """2 ranks x 5 examples take the steps of 1 process x 10: same per-epoch losses, dev scores and final
    weights (fp32, no dropout, atol 1e-5), also across partial batches split 3 + 2 and 1 + 0; both ranks end
    with identical weights; rank 1 writes nothing; the run directory holds exactly the files one process writes."""
    single = trainer_for(_no_dropout(tiny_env, tmp_path / "single"))
    single.fit()
    single.load_best()
    single.run_dir.close()  # releases run.lock, as tasks.training.run.run does at the end of a run
    _spawn("parity", tiny_env, tmp_path)

    ranks = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    weights = [load_file(str(tmp_path / "results" / f"rank{r}.safetensors")) for r in range(2)]
    assert ranks[1]["writes"] == [], "rank 1 wrote under out_dir"
    for k, v in weights[0].items():
        assert torch.equal(v, weights[1][k]), f"ranks disagree at {k}"
    ref = single.model.state_dict()
    assert ref.keys() == weights[0].keys()
    for k, v in ref.items():
        torch.testing.assert_close(weights[0][k], v, atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    for one, two in zip(single.history, ranks[0]["history"], strict=True):
        assert one["train"].keys() == two["train"].keys()
        for term in one["train"]:
            assert two["train"][term] == pytest.approx(one["train"][term], abs=1e-5), term
        for metric, value in one["dev"].items():
            assert two["dev"][metric] == pytest.approx(value, abs=1e-4), metric
    assert _files(tmp_path / "ddp") == _files(tmp_path / "single")
    records = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in records] == [1, 2]


def _assert_resumed_equal_full(tmp_path) -> None:
    """Both ranks of the resumed run hold the uninterrupted run's weights, bit for bit."""
    full = load_file(str(tmp_path / "results" / "rank0.safetensors"))
    for r in range(2):
        resumed = load_file(str(tmp_path / "results" / f"resumed{r}.safetensors"))
        for k, v in full.items():
            assert torch.equal(v, resumed[k]), f"rank {r}: {k}"


def test_two_process_resume_is_bit_identical(tiny_env, tmp_path):
    """With dropout on (each rank its own masks), a 2-process run interrupted mid-epoch and resumed by 2 processes
    ends with the weights of the uninterrupted 2-process run, bit for bit: every rank's RNG state is checkpointed."""
    _spawn("resume", tiny_env, tmp_path)
    _assert_resumed_equal_full(tmp_path)
    state = json.loads((tmp_path / "cut" / "checkpoints" / "last" / "state.json").read_text())
    assert len(state["rng_other_ranks"]) == 1 and state["rng_other_ranks"][0]["torch"] != state["rng"]["torch"]


@pytest.mark.gpu
def test_two_process_resume_on_nccl_is_bit_identical(tiny_env, tmp_path):
    """On two GPUs (NCCL), with --deterministic: the resumed run ends with the uninterrupted run's weights on
    both ranks, bit for bit (the guarantee tasks/runtime.py states for CUDA)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("gpu: needs two CUDA devices")
    _spawn("resume_nccl", tiny_env, tmp_path)
    _assert_resumed_equal_full(tmp_path)


def test_two_process_knn_bert_resume_keeps_each_ranks_queues(tiny_env, tmp_path):
    """KNN-BERT under 2 processes: each rank fills its queues from its own shard, so the queues differ by rank.
    A run interrupted mid-epoch and resumed ends with the uninterrupted run's weights, and every rank's queues
    and momentum encoder equal that rank's in the uninterrupted run (rank 1 resumed with rank 0's queues before)."""
    _spawn("resume_knn", tiny_env, tmp_path)
    res = tmp_path / "results"
    full = [load_file(str(res / f"full-objective{r}.safetensors")) for r in range(2)]
    resumed = [load_file(str(res / f"resumed-objective{r}.safetensors")) for r in range(2)]
    queues = [k for k in full[0] if "_queue_keys" in k]
    assert queues and any(not torch.equal(full[0][k], full[1][k]) for k in queues), "the ranks' queues are equal"
    for r in range(2):
        assert full[r].keys() == resumed[r].keys()
        for k, v in full[r].items():
            assert torch.equal(v, resumed[r][k]), f"rank {r}: {k}"
        weights = load_file(str(res / f"resumed{r}.safetensors"))
        for k, v in load_file(str(res / "rank0.safetensors")).items():
            assert torch.equal(v, weights[k]), f"rank {r}: {k}"
    last = tmp_path / "cut" / "checkpoints" / "last"
    assert _files(last) == sorted([*_files(tmp_path / "full" / "checkpoints" / "last")])
    assert "objectives.rank1.safetensors" in _files(last)


def test_two_processes_with_multi_pass_objectives_and_swa_stay_in_step(tiny_env, tmp_path):
    """run() under 2 processes with SMART (several forward passes per step), RIFT (a PGD attack, parameters of its
    own outside the model) and an SWA phase: both ranks end with the same weights bit for bit, rank 0 alone
    writes the SWA checkpoint and the predictions, rank 1 writes nothing."""
    _spawn("objectives", tiny_env, tmp_path)
    ranks = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    weights = [load_file(str(tmp_path / "results" / f"rank{r}.safetensors")) for r in range(2)]
    for k, v in weights[0].items():
        assert torch.equal(v, weights[1][k]), f"ranks disagree at {k}"
    assert ranks[1]["writes"] == [] and "rank" in ranks[1]["summary"]
    assert ranks[0]["summary"]["swa"]["n_averaged"] == 1 and ranks[0]["summary"]["predictions"]
    assert (tmp_path / "obj" / "checkpoints" / "swa" / "model.safetensors").is_file()
    terms = json.loads((tmp_path / "obj" / "metrics.jsonl").read_text().splitlines()[0])["train"]
    assert "sst/rift.info" in terms and "sts/smart.penalty" in terms


# ---- the CLI under torchrun ------------------------------------------------------------------------------------


def _cli_flags(env, out_dir: Path) -> list[str]:
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data), "--out-dir", str(out_dir), "--device", "cpu",
            "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32", "--fcn-size", "16",
            "--lr", "1e-3", "--log-every", "2", "--epochs", "1", "--limit", "16"]


def test_torchrun_cli_writes_what_one_process_writes(tiny_env, tmp_path):
    """`torchrun --nproc_per_node=2 train_multitask.py ...` trains, and its run directory holds exactly the files
    of a one-process run: one train.log with rank 0's lines only, one record per epoch plus the final one."""
    cli.main(_cli_flags(tiny_env, tmp_path / "single"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "train_multitask.py"), *_cli_flags(tiny_env, tmp_path / "ddp")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _files(tmp_path / "ddp") == _files(tmp_path / "single")
    log = (tmp_path / "ddp" / "train.log").read_text()
    assert "torchrun: 2 processes" in log and "[rank 1]" not in log
    assert log.count("epoch 1 done") == 1
    records = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in records] == [1, None] and records[-1]["final"]


# ---- refusals before any work ----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["--batch-size", "7"], "not multiples of the 2 processes"),
    (["--batch-size", "8", "--task-batch-size", "sst=5", "--schedule", "round_robin"], "not multiples"),
    (["--device", "cuda:1"], "names one GPU"),
    (["--eval-only"], "start it with python, not torchrun"),
])
def test_torchrun_refuses_bad_combinations_before_any_work(argv, message, monkeypatch, capsys, tmp_path):
    """Under WORLD_SIZE=2 a batch size that does not split evenly, one GPU for all ranks, or --eval-only are
    refused by the CLI with a sentence (exit status 2) before any data is read."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("tasks.training.trainer.Trainer", None)  # any attempt to train would fail differently
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--out-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_one_process_needs_no_process_group(monkeypatch):
    """Without torchrun's variables everything is one process: rank 0 of 1, shard = the whole batch, no group."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert runtime.torchrun_env() == (0, 1, 0) and distributed.is_main() and not distributed.is_distributed()
    assert distributed.shard([4, 5, 6]) == [4, 5, 6]
    assert distributed.setup(torch.device("cpu")) == torch.device("cpu")
    assert not torch.distributed.is_initialized()
    distributed.check_config({"sst": 7}, "cuda:1")  # nothing to split
