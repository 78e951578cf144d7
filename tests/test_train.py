"""Tests for tasks/trainer.py, tasks/train.py and tasks/checkpoint.py: the training loop, loss weights, checkpoints,
exact resume.

Everything runs on a tiny random BERT (hidden 32, 2 layers, 4 heads, vocab 99)
saved as a HF-style checkpoint directory in tmp, with small synthetic task
files in the CS224N formats, so the real code path (load_pretrained, the
tokenizer, the readers) is exercised end to end on CPU in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minbert.bert import BertModel
from tasks.config import TrainConfig, check_resume_config
from tasks.evaluation.evaluator import evaluate_checkpoint
from tasks.evaluation.files import read_predictions
from tasks.model import ModelConfig
from tasks.objectives import registered_objectives
from tasks.training import checkpoint as ckpt_mod
from tasks.training import runtime
from tasks.training import trainer as trainer_mod
from tasks.training.checkpoint import atomic_directory, read_json, resolve_checkpoint
from tasks.training.run import run
from tasks.training.trainer import Hook, Trainer
from tests.helpers import tiny_config

POSITIVE = ["good", "great", "fun", "superb", "lovely"]
NEGATIVE = ["bad", "awful", "dull", "boring", "poor"]
NEUTRAL = ["movie", "film", "plot", "story", "actor", "scene", "the", "a", "is", "was", "very", "quite"]
QUESTION = ["how", "what", "why", "do", "i", "learn", "cook", "python", "rice", "code", "fast", "best", "way", "to"]
WORDS = POSITIVE + NEGATIVE + NEUTRAL + QUESTION + ["?", ".", "cat", "dog", "sits", "runs", "on", "mat", "park"]


# ---- fixtures: a tiny pretrained checkpoint and synthetic data ------------------------------------------


def write_tiny_model(directory: Path) -> Path:
    """A HF-style BERT directory: config.json, model.safetensors (random tiny BERT), vocab.txt (99 tokens)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config()
    torch.manual_seed(1234)
    model = BertModel(cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    cfg.to_json_file(directory / "config.json")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab += [f"[unused{i}]" for i in range(cfg.vocab_size - len(vocab))]
    assert len(vocab) == cfg.vocab_size
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


def _sentence(rng: random.Random, label: int) -> str:
    """A sentence whose sentiment words say its label (0 = very negative ... 4 = very positive)."""
    pos, neg = {0: (0, 3), 1: (0, 1), 2: (0, 0), 3: (1, 0), 4: (3, 0)}[label]
    words = rng.sample(NEUTRAL, 4) + rng.choices(POSITIVE, k=pos) + rng.choices(NEGATIVE, k=neg)
    rng.shuffle(words)
    return " ".join(words) + " ."


def _question(rng: random.Random) -> str:
    return " ".join(rng.sample(QUESTION, 5)) + " ?"


def write_tiny_data(directory: Path, n_train: int = 48, n_dev: int = 24, n_test: int = 16,
                    quora_test: bool = False) -> Path:
    """CS224N-format task files (tab-separated, unnamed index column) and an NLI file, all synthetic."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)

    def write(name: str, header: list[str], rows: list[list]) -> None:
        lines = ["\t".join(header)] + ["\t".join(str(x) for x in row) for row in rows]
        (directory / name).write_text("\n".join(lines) + "\n")

    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        labels = [i % 5 for i in range(n)]
        sst = [[i, f"sst-{split}-{i}", " " + _sentence(rng, y)] + ([y] if split != "test" else [])
               for i, y in enumerate(labels)]
        para, sts = [], []
        for i in range(n):
            a = _question(rng)
            dup = i % 2
            b = a.replace("?", "") + " ?" if dup else _question(rng)
            para.append([i, f"para-{split}-{i}", a, b] + ([f"{float(dup)}"] if split != "test" else []))
            s1 = _sentence(rng, i % 5)
            overlap = i % 6
            s2 = " ".join(s1.split()[:overlap] + rng.sample(NEUTRAL, max(1, 5 - overlap))) + " ."
            sts.append([i, f"sts-{split}-{i}", s1, s2] + ([f"{float(overlap * 5 / 5)}"] if split != "test" else []))
        if split == "test":
            write("ids-sst-test-student.csv", ["0", "", "id", "sentence"], [[i, float(i), *r[1:]] for i, r in enumerate(sst)])
            if quora_test:
                write("quora-test-student.csv", ["", "id", "sentence1", "sentence2"], para)
            write("sts-test-student.csv", ["", "id", "sentence1", "sentence2"], sts)
        else:
            write(f"ids-sst-{split}.csv", ["", "id", "sentence", "sentiment"], sst)
            write(f"quora-{split}.csv", ["", "id", "sentence1", "sentence2", "is_duplicate"], para)
            write(f"sts-{split}.csv", ["", "id", "sentence1", "sentence2", "similarity"], sts)
    nli = ["sent0,sent1,hard_neg"] + [f"{_sentence(rng, 4)},{_sentence(rng, 3)},{_sentence(rng, 0)}"
                                      for _ in range(n_train)]
    (directory / "nli-train.csv").write_text("\n".join(nli) + "\n")
    return directory


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="session")
def tiny_env(tmp_path_factory):
    """(pretrained dir, data dir) shared by the tests of a session (both read-only)."""
    root = tmp_path_factory.mktemp("tiny")
    return write_tiny_model(root / "bert"), write_tiny_data(root / "data")


def tiny_train_config(env: tuple[Path, Path], out_dir: Path, **overrides) -> TrainConfig:
    """A fast CPU config on the tiny model: 2 epochs of ~15 steps, dropout on (so RNG state matters). Pairs are
    scored in one order without the STS and SST priors (the fixtures' best epochs were found so; tests of their
    own cover --symmetric-eval, --sts-prior and --sst-prior)."""
    pretrained, data = env
    kw = dict(pretrained=str(pretrained), data_dir=str(data), out_dir=str(out_dir), epochs=2, batch_size=8,
              eval_batch_size=16, max_length=32, max_train_examples={}, dev_max_examples={}, lr=1e-3,
              symmetric_eval=False, sts_prior=0.0, sst_prior=0.0,
              lr_schedule="warmup_linear", warmup=0.1, log_every=5, device="cpu", bf16=False,
              model=ModelConfig(arch="b1", pair_encoding="cross", fcn_size=16, head_dropout=0.1))
    kw.update(overrides)
    return TrainConfig(**kw)


def _optimizer_tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v for i, p in enumerate(trainer.params) for k, v in trainer.optimizer.state[p].items()}


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"weights differ at {k}"
    oa, ob = _optimizer_tensors(a), _optimizer_tensors(b)
    assert oa.keys() == ob.keys() and oa
    for k in oa:
        assert torch.equal(oa[k], ob[k]), f"optimizer state differs at {k}"


class _Interrupt(Exception):
    pass


class _StopAt(Hook):
    """Raises after global step ``step`` (mid-epoch) or after epoch ``epoch`` ended: a crash mid-run."""

    def __init__(self, step: int | None = None, epoch: int | None = None):
        self.at_step, self.at_epoch = step, epoch

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.global_step == self.at_step:
            raise _Interrupt

    def on_epoch_end(self, trainer: Trainer, record: dict) -> None:
        if trainer.epoch == self.at_epoch:
            raise _Interrupt


def run_whole_and_cut(env, tmp_path: Path, stop_step: int, **overrides) -> tuple[Trainer, Trainer]:
    """(a whole run, the same run cut after global step ``stop_step`` and resumed), checked equal bit for bit."""
    full = Trainer.from_config(tiny_train_config(env, tmp_path / "full", **overrides))
    full.fit()
    cfg = tiny_train_config(env, tmp_path / "cut", **overrides)
    with pytest.raises(_Interrupt):
        Trainer.from_config(cfg, hooks=[_StopAt(step=stop_step)]).fit()
    resumed = Trainer.from_config(cfg, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    resumed.fit()
    _assert_same_state(full, resumed)
    return full, resumed


# ---- the loop -------------------------------------------------------------------------------------------


def test_a_few_epochs_reduce_the_loss(tiny_env, tmp_path):
    """Training lowers every task's mean head loss from the first epoch to the last and logs every term."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=4, lr=2e-3, warmup=0.0)
    trainer = Trainer.from_config(cfg)
    trainer.fit()
    first, last = trainer.history[0]["train"], trainer.history[-1]["train"]
    assert set(first) == {"loss", "sst/loss", "para/loss", "sts/loss"}
    for term in first:
        assert last[term] < first[term], (term, first[term], last[term])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert {"sst_acc", "para_acc", "sts_r", "overall"} <= set(records[0]["dev"])
    assert (tmp_path / "run" / "training.png").stat().st_size > 0


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_loss_weights_scale_the_task_gradients(tiny_env, tmp_path, weight):
    """A stream's loss weight multiplies its gradients: weight 0 gives exactly zero gradients, 2 doubles them."""
    base = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "a"))
    weighted = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "b", loss_weights={"para": weight}))
    weighted.model.load_state_dict(base.model.state_dict())
    batch = base.train_sets["para"].collate(list(range(8)))
    grads = []
    for trainer in (base, weighted):
        trainer.model.eval()  # no dropout: both passes compute the same function
        trainer.model.zero_grad(set_to_none=True)
        loss, terms = trainer.step_loss("para", batch)
        loss.backward()
        grads.append({n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None})
        assert set(terms) == {"para/loss"}
    assert grads[0], "the paraphrase loss reaches no parameter"
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], weight * g, atol=1e-7), name
    if weight == 0.0:
        assert all(torch.count_nonzero(g) == 0 for g in grads[1].values())


def test_learning_rate_schedules(tiny_env, tmp_path):
    """constant stays; epoch_decay is lr - decay·epoch (paper §4.5); warmup_linear rises then decays to ~0."""
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "r", lr_schedule="epoch_decay", lr=1e-5, lr_decay=4e-7))
    assert t.lr_at(0, 5, 10) == 1e-5 and t.lr_at(3, 0, 10) == pytest.approx(1e-5 - 3 * 4e-7)
    t.cfg = dataclasses.replace(t.cfg, lr_schedule="constant")
    assert t.lr_at(1, 3, 10) == 1e-5
    t.cfg = dataclasses.replace(t.cfg, lr_schedule="warmup_linear", warmup=0.25, epochs=2)
    lrs = [t.lr_at(e, s, 10) for e in range(2) for s in range(10)]
    assert lrs[4] == pytest.approx(1e-5) and lrs[0] < lrs[1] < lrs[4]
    assert all(a > b for a, b in zip(lrs[5:], lrs[6:])) and 0 < lrs[-1] < 1e-6


def test_optimizer_excludes_biases_and_layernorm_from_weight_decay(tiny_env, tmp_path):
    """AdamW groups: matrices decay, biases and LayerNorm weights (1-D) do not."""
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "r", weight_decay=0.05))
    decay, no_decay = t.optimizer.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    names = dict(zip(map(id, t.params), t.param_names))
    assert any("LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert len(t.params) == sum(1 for p in t.model.parameters() if p.requires_grad)


# ---- checkpoints ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["mid-epoch", "epoch-end"])
def test_resume_is_bit_identical(tiny_env, tmp_path, where):
    """A run interrupted and resumed from its checkpoint ends with the same weights and optimizer state, bit for bit."""
    full = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "full", checkpoint_every=4))
    full.fit()
    cfg = tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4)
    stop = _StopAt(step=9) if where == "mid-epoch" else _StopAt(epoch=1)
    with pytest.raises(_Interrupt):
        Trainer.from_config(cfg, hooks=[stop]).fit()
    last = tmp_path / "cut" / "checkpoints" / "last"
    state = read_json(last / "state.json")
    if where == "mid-epoch":
        assert (state["epoch"], state["global_step"]) == (0, 8) and state["step"] == 8
    else:
        assert (state["epoch"], state["step"]) == (1, 0)
    resumed = Trainer.from_config(cfg, resume_from=last)
    resumed.fit()
    _assert_same_state(full, resumed)
    assert [r["train"] for r in resumed.history] == [r["train"] for r in full.history]
    assert [r["dev"] for r in resumed.history] == [r["dev"] for r in full.history]
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]


@pytest.fixture
def restore_determinism(monkeypatch):
    """--deterministic sets process-wide state: torch's flag and CUBLAS_WORKSPACE_CONFIG are put back after."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_deterministic_run_resumes_bit_identically(tiny_env, tmp_path, restore_determinism):
    """--deterministic (the CUDA resume guarantee, tasks/runtime.py) reaches torch, and training and resuming with
    it on stays bit-exact on CPU."""
    cfg_full = tiny_train_config(tiny_env, tmp_path / "full", checkpoint_every=4, deterministic=True)
    full = Trainer.from_config(cfg_full)
    assert torch.are_deterministic_algorithms_enabled()
    full.fit()
    cfg = tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4, deterministic=True)
    with pytest.raises(_Interrupt):
        Trainer.from_config(cfg, hooks=[_StopAt(step=9)]).fit()
    resumed = Trainer.from_config(cfg, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    resumed.fit()
    _assert_same_state(full, resumed)
    with pytest.raises(ValueError, match="deterministic"):  # not a field a resume may change
        check_resume_config(cfg, tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4))


@pytest.mark.parametrize("objective", ["simcse", "knn_bert"])
def test_resume_with_objective_state_is_bit_identical(tiny_env, tmp_path, objective):
    """Objectives' terms and state (KNN-BERT's queues and momentum encoder) survive a resume bit for bit."""
    if objective not in registered_objectives():
        pytest.skip(f"objective {objective} is not registered")
    kw = dict(objectives={objective: {}}, checkpoint_every=5, epochs=1)
    if objective == "knn_bert":
        kw["objectives"] = {objective: {"m_most": 2, "m_least": 2, "queue_size": 20}}
    full, resumed = run_whole_and_cut(tiny_env, tmp_path, 6, **kw)
    a, b = full.objectives[0].state_dict(), resumed.objectives[0].state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(k.startswith(f"{objective}/") or "/" + objective in k for k in full.history[0]["train"])


def test_checkpoint_files_are_safetensors_and_json_only(tiny_env, tmp_path, monkeypatch):
    """A checkpoint holds only safetensors and JSON (plus the vocabulary); nothing is pickled or torch.loaded."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    Trainer.from_config(cfg).fit()
    ckpt = tmp_path / "run" / "checkpoints" / "last"
    files = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    encoder = ["1_Pooling/config.json", "config.json", "model.safetensors", "modules.json",
               "sentence_bert_config.json", "special_tokens_map.json", "tokenizer_config.json", "vocab.txt"]
    assert files == sorted(["config.json", *("encoder/" + f for f in encoder), "model.safetensors",
                            "optimizer.json", "optimizer.safetensors", "state.json"])
    for name in files:
        raw = (ckpt / name).read_bytes()
        assert not raw.startswith(b"\x80"), f"{name} looks like a pickle"
        if name.endswith(".json"):
            json.loads(raw)
        elif name.endswith(".safetensors"):
            assert load_file(str(ckpt / name))
    with safe_open(str(ckpt / "optimizer.safetensors"), "pt") as f:
        assert any(k.endswith(".exp_avg_sq") for k in f.keys())
    state = read_json(ckpt / "state.json")
    assert {"torch", "python", "numpy"} <= set(state["rng"]) and isinstance(state["rng"]["torch"], str)
    assert TrainConfig.from_dict(read_json(ckpt / "config.json")) == cfg

    def no_torch_load(*a, **k):
        raise AssertionError("torch.load must not be used to read a checkpoint")

    monkeypatch.setattr(torch, "load", no_torch_load)
    Trainer.from_config(cfg, resume_from=ckpt)  # loads model, optimizer, state without torch.load
    evaluate_checkpoint(ckpt, out_dir=tmp_path / "eval")


def test_atomic_directory_leaves_no_partial_checkpoint(tmp_path):
    """A failure while writing leaves the previous checkpoint untouched and no stray temporary directory."""
    final = tmp_path / "checkpoints" / "last"
    with atomic_directory(final) as tmp:
        (tmp / "a.json").write_text('{"v": 1}')
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "a.json").write_text('{"v": 2}')
            raise RuntimeError("disk full")
    assert json.loads((final / "a.json").read_text()) == {"v": 1}
    assert sorted(p.name for p in final.parent.iterdir()) == ["last"]
    fresh = tmp_path / "checkpoints" / "best"
    with pytest.raises(RuntimeError):
        with atomic_directory(fresh) as tmp:
            raise RuntimeError("killed")
    assert not fresh.exists() and sorted(p.name for p in final.parent.iterdir()) == ["last"]


def test_failed_checkpoint_write_keeps_the_previous_one(tiny_env, tmp_path, monkeypatch):
    """Trainer.save_checkpoint failing half-way keeps the old 'last' complete and loadable."""
    trainer = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "run", epochs=1))
    trainer.fit()
    last = trainer.run_dir.checkpoints / "last"
    before = (last / "model.safetensors").read_bytes()
    calls = []

    def failing(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("no space left on device")
        ckpt_mod.save_tensors(path, tensors, metadata)

    monkeypatch.setattr(trainer_mod, "save_tensors", failing)
    trainer.global_step += 1
    with pytest.raises(OSError):
        trainer.save_checkpoint("last")
    assert (last / "model.safetensors").read_bytes() == before
    assert resolve_checkpoint(last) == last
    assert sorted(p.name for p in trainer.run_dir.checkpoints.iterdir()) == ["best", "last"]


def test_fresh_run_refuses_existing_checkpoints(tiny_env, tmp_path):
    """A fresh run into a directory with checkpoints raises unless overwrite is set."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    Trainer.from_config(cfg).fit()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer.from_config(cfg)
    Trainer.from_config(cfg, overwrite=True)


def test_resume_refuses_a_changed_config(tiny_env, tmp_path):
    """Resuming with a different learning rate is refused; more epochs or another device is allowed."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, lr_schedule="constant")
    Trainer.from_config(cfg).fit()
    last = tmp_path / "run" / "checkpoints" / "last"
    with pytest.raises(ValueError, match="lr"):
        Trainer.from_config(dataclasses.replace(cfg, lr=5e-4), resume_from=last)
    t = Trainer.from_config(dataclasses.replace(cfg, epochs=2, log_every=3), resume_from=last)
    assert t.epoch == 1


# ---- predictions ------------------------------------------------------------------------------------------


def _rows(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_run_writes_dev_and_test_predictions_and_skips_missing_test(tiny_env, tmp_path, caplog):
    """run() reloads the best checkpoint and writes every task's dev and test files; the missing Quora test is skipped."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    caplog.set_level("WARNING")
    summary = run(cfg)
    pred = tmp_path / "run" / "predictions"
    names = sorted(p.name for p in pred.iterdir())
    assert names == sorted(f"{t}-{s}-{kind}.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")
                           for kind in ("output", "logits") if not (t == "para" and s == "test"))
    assert _rows(pred / "sst-dev-output.csv")[0] == "id \t Predicted_Sentiment "
    assert len(_rows(pred / "sst-test-output.csv")) == 1 + 16
    assert _rows(pred / "sts-dev-output.csv")[0] == "id \t Predicted_Similiary "  # sic, the CS224N starter's
    assert any("para test" in s for s in summary["skipped"])
    assert "quora-test-student.csv" in caplog.text
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and set(final["dev"]) == {"sst_acc", "para_acc", "sts_r", "overall"}


def test_eval_only_rebuilds_the_model_from_the_checkpoint_alone(tiny_env, tmp_path):
    """evaluate_checkpoint needs no pretrained directory (deleted here) and reproduces the run's final dev metrics;
    only the STS prior reads one (its sentence encoder's, when that is this one), and without it says so and how
    to go on."""
    pretrained = shutil.copytree(tiny_env[0], tmp_path / "bert")
    summary = run(tiny_train_config((pretrained, tiny_env[1]), tmp_path / "run", epochs=1, sts_prior=0.0))
    shutil.rmtree(pretrained)
    result = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "best", out_dir=tmp_path / "eval")
    assert result["dev"] == summary["dev"]
    assert (tmp_path / "eval" / "predictions" / "sts-test-output.csv").is_file()
    with pytest.raises(FileNotFoundError, match="STS prior.*is gone: restore it, .*or pass --sts-prior 0"):
        evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "best", out_dir=tmp_path / "eval2",
                            overrides={"sts_prior": 0.5, "sts_prior_model": str(pretrained)})


def test_limit_caps_every_split(tiny_env, tmp_path):
    """limit=N reads at most N examples of every split of every task, NLI included, and predictions follow."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, limit=10, nli=True,
                            objectives={"mnr": {}}, model=ModelConfig(arch="b1", pair_encoding="siamese", fcn_size=16))
    if "mnr" not in registered_objectives():
        pytest.skip("objective mnr is not registered")
    trainer = Trainer.from_config(cfg)
    assert {s: len(d) for s, d in trainer.train_sets.items()} == {"sst": 10, "para": 10, "sts": 10, "nli": 10}
    assert {t: len(d) for t, d in trainer.dev_sets.items()} == {"sst": 10, "para": 10, "sts": 10}
    trainer.fit()
    assert "nli/mnr.loss" in trainer.history[0]["train"]
    assert "nli/loss" not in trainer.history[0]["train"]  # the NLI stream has no head loss


def test_dev_subset_between_epochs_is_fixed(tiny_env, tmp_path):
    """dev_max_examples scores a fixed subset between epochs; the final evaluation reads the whole dev set."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, dev_max_examples={"para": 8})
    t1, t2 = Trainer.from_config(cfg), Trainer.from_config(cfg, overwrite=True)
    assert len(t1.dev_sets["para"]) == 8 and t1.dev_sets["para"].ids == t2.dev_sets["para"].ids
    assert len(t1.dev_sets["sst"]) == 24


@pytest.mark.parametrize("final_dev", ["full", "capped"])
def test_final_dev_full_or_capped(tiny_env, tmp_path, final_dev):
    """final_dev capped scores the between-epoch subset at the end too (the same ids); full reads every row."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, dev_max_examples={"para": 8}, final_dev=final_dev)
    run(cfg)
    ids, _ = read_predictions(tmp_path / "run" / "predictions" / "para-dev-output.csv")
    if final_dev == "capped":
        assert sorted(ids) == sorted(Trainer.from_config(cfg, overwrite=True).dev_sets["para"].ids)
    else:
        assert len(ids) == 24


def test_encoder_dropout_reaches_the_encoder_and_cpu_bf16_trains(tiny_env, tmp_path):
    """encoder_dropout sets every dropout inside the encoder (not only the heads); bf16 autocast trains on CPU."""
    trainer = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "run", epochs=1, encoder_dropout=0.25, bf16=True))
    enc = trainer.model.encoder
    rates = [m.dropout_p for m in enc.modules() if hasattr(m, "dropout_p")]
    assert len(rates) >= 1 + 3 * enc.config.num_hidden_layers and set(rates) == {0.25}
    assert enc.config.hidden_dropout_prob == enc.config.attention_probs_dropout_prob == 0.25
    assert trainer.amp_dtype == torch.bfloat16
    trainer.fit()
    assert all(v is not None for v in trainer.history[0]["train"].values())


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's imports
def test_compile_takes_the_same_steps_as_eager(tiny_env, tmp_path):
    """compile=True (torch.compile of the encoder, inductor on CPU: ~20 s cold, ~6 s with inductor's cache) gives the
    losses and weights of eager mode over two training steps (fp32, no dropout, atol 1e-5)."""
    no_dropout = ModelConfig(arch="b1", pair_encoding="cross", fcn_size=16, head_dropout=0.0)
    trainers = [Trainer.from_config(tiny_train_config(tiny_env, tmp_path / str(c), tasks=("sst",), encoder_dropout=0.0,
                                          compile=c, model=no_dropout)) for c in (False, True)]
    batch = trainers[0].train_sets["sst"].collate(list(range(8)))  # one shape: compiled once
    losses = []
    for t in trainers:
        t.model.train()
        losses.append([t.train_step("sst", batch, 1e-3)["loss"] for _ in range(2)])
    assert losses[0][0] != losses[0][1]  # the first step changed the model
    torch.testing.assert_close(torch.stack(losses[1]), torch.stack(losses[0]), atol=1e-5, rtol=0)
    eager, compiled = (t.model.state_dict() for t in trainers)
    assert eager.keys() == compiled.keys()
    for k in eager:
        torch.testing.assert_close(compiled[k], eager[k], atol=1e-5, rtol=0)


def test_fused_adamw_trains_like_the_foreach_path(tiny_env, tmp_path):
    """fused_adamw uses the fused kernel for the same update: the same epoch losses and weights up to rounding."""
    trainers = []
    for fused in (False, True):
        t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / f"run{fused}", epochs=2, fused_adamw=fused))
        assert all(g["fused"] is fused and g["foreach"] is not fused for g in t.optimizer.param_groups)
        t.fit()
        trainers.append(t)
    a, b = trainers
    for ra, rb in zip(a.history, b.history):
        for k in ra["train"]:
            assert abs(ra["train"][k] - rb["train"][k]) < 1e-4, k
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-4, rtol=1e-4, msg=n)


def test_gradient_checkpointing_trains_exactly_as_without(tiny_env, tmp_path):
    """gradient_checkpointing=True recomputes each encoder layer in backward (dropout on: the recomputation must
    draw the same masks): the same epoch losses and final weights as storing the activations."""
    trainers = []
    for ckpt in (False, True):
        t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / f"run{ckpt}", epochs=1, encoder_dropout=0.1,
                                      gradient_checkpointing=ckpt))
        assert t.model.encoder.encoder.gradient_checkpointing is ckpt
        t.fit()
        trainers.append(t)
    plain, checkpointed = trainers
    assert plain.history[0]["train"].keys() == checkpointed.history[0]["train"].keys()
    for k, v in plain.history[0]["train"].items():
        assert checkpointed.history[0]["train"][k] == pytest.approx(v, abs=1e-6), k
    for (n, pa), pb in zip(plain.model.named_parameters(), checkpointed.model.parameters()):
        torch.testing.assert_close(pb, pa, atol=1e-6, rtol=0, msg=n)


@pytest.mark.parametrize("amx, avx512_bf16, expected", [
    (True, False, torch.bfloat16), (False, True, torch.bfloat16), (False, False, None)])
def test_bf16_is_the_cpu_default_where_the_cpu_multiplies_bf16_natively(monkeypatch, amx, avx512_bf16, expected):
    """bf16=None: autocast on CPUs with AMX or AVX512_BF16 (both measured faster), off where bf16 is emulated;
    an explicit choice always wins."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    cpu = torch.device("cpu")
    assert runtime.autocast_dtype(None, cpu) is expected
    assert runtime.autocast_dtype(True, cpu) is torch.bfloat16
    assert runtime.autocast_dtype(False, cpu) is None


def test_fused_adamw_is_the_default_and_the_foreach_path_stays_selectable(tiny_env, tmp_path):
    """TrainConfig() trains with the fused kernel; fused_adamw=False (--no-fused-adamw) builds the foreach path."""
    assert TrainConfig().fused_adamw is True
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "default", epochs=1))
    assert all(g["fused"] and not g["foreach"] for g in t.optimizer.param_groups)
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "foreach", epochs=1, fused_adamw=False))
    assert all(g["foreach"] and not g["fused"] for g in t.optimizer.param_groups)


def test_final_log_line_says_what_dev_was_scored_on():
    """Under --limit the final line must not claim the full dev sets (it used the first N rows)."""
    from tasks.training.run import final_dev_scope

    assert final_dev_scope(TrainConfig()) == "full sets"
    assert final_dev_scope(TrainConfig(final_dev="capped")) == "capped subsets"
    assert "--limit" in final_dev_scope(TrainConfig(limit=64)) and "full" not in final_dev_scope(TrainConfig(limit=64))
