"""Tests of tasks/training/pretraining.py: MLM pretraining on the training loop (the loss goes down, the records,
bf16), the checkpoint it leaves, exact resume of a killed run. The command (python -m tasks.pretrain) is tested in
tests/test_pretrain.py; the masking in tests/training/test_masking.py."""

from __future__ import annotations

import json

import pytest
import torch

from minbert.bert import BertModel
from minbert.mlm import BertForMaskedLM, load_mlm
from minbert.pretrained import load_pretrained
from minbert.tokenizer import BertTokenizer
from tasks.training import masking as mlm_module
from tasks.training import pretraining as pretrain_module
from tasks.training.masking import evaluate_mlm, make_eval_batches
from tasks.training.pretraining import PretrainConfig, pretrain, save_mlm_checkpoint
from tests.helpers import tiny_config, write_vocab_dir


def test_pretrain_reduces_loss_and_writes_loadable_checkpoint(tmp_path):
    """A tiny model on tiny sentences: held-out-masks loss goes down; the checkpoint loads with equal weights."""
    torch.manual_seed(0)
    cfg = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    mlm = BertForMaskedLM(BertModel(cfg))
    # sentences over 10 of the 94 words: learnable in a few steps (ln 99 -> towards ln 10)
    g = torch.Generator().manual_seed(0)
    sentences = [" ".join(f"w{j}" for j in torch.randint(0, 10, (8,), generator=g).tolist()) for _ in range(64)]
    data = make_eval_batches(tok, sentences, max_length=16, batch_size=32, seed=123)  # fixed masks
    before = evaluate_mlm(mlm, data)["loss"]
    config = PretrainConfig(epochs=5, batch_size=16, lr=3e-3, max_length=16, seed=0, log_every=5)
    records = pretrain(mlm, tok, sentences, config)
    after = evaluate_mlm(mlm, data)["loss"]
    assert after < before - 0.8, (before, after)
    assert [r["step"] for r in records] == [5, 10, 15, 20] and records[-1]["loss"] < records[0]["loss"]

    out = save_mlm_checkpoint(tmp_path / "mlm", mlm, tok, extra_files={"pretrain_log.jsonl": "{}\n"})
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    loaded, tok2 = load_pretrained(out)
    assert len(tok2) == 99
    ours = mlm.bert.state_dict()
    theirs = loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    mlm2, _, had_head = load_mlm(out)
    assert had_head
    assert all(torch.equal(a, b) for a, b in zip(mlm.head.state_dict().values(), mlm2.head.state_dict().values()))
    assert mlm2.head.decoder.weight is mlm2.bert.embeddings.word_embeddings.weight
    # written again over itself: replaced atomically, no temporary siblings left behind
    save_mlm_checkpoint(tmp_path / "mlm", mlm2, tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlm", "vocab"]


def test_refuses_to_replace_a_non_checkpoint_directory(tmp_path):
    """--out-dir pointing at a directory with other files (no config.json) is refused, untouched."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    with pytest.raises(FileExistsError, match="not a checkpoint directory"):
        save_mlm_checkpoint(tmp_path / "work", BertForMaskedLM(BertModel(tiny_config())), tok)
    assert (tmp_path / "work" / "notes.txt").read_text() == "keep me"


def test_a_full_disk_while_saving_is_a_full_disk_and_leaves_nothing(tmp_path, monkeypatch):
    """A failed write of model.safetensors (safetensors' own error) is the OSError it names, so it reads "disk full
    writing ...", not "truncated or corrupted"; no half-written directory is left at --out-dir."""
    import errno

    from safetensors import SafetensorError

    from tasks import storage

    def full(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(storage, "save_file", full)
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    with pytest.raises(OSError) as exc:
        save_mlm_checkpoint(tmp_path / "mlm", BertForMaskedLM(BertModel(tiny_config())), tok)
    assert exc.value.errno == errno.ENOSPC and exc.value.filename.endswith("model.safetensors")
    assert not (tmp_path / "mlm").exists()


@pytest.mark.parametrize("bf16,want", [(None, None), (True, torch.bfloat16), (False, None)])
def test_bf16_autocast_is_asked_for_on_the_cpu(tmp_path, monkeypatch, bf16, want):
    """--bf16 runs the MLM steps under bf16 autocast on a CPU; unset, a CPU stays in fp32 (the default, as
    measured before the flag existed), and --no-bf16 keeps it there."""
    seen = []
    real = pretrain_module.autocast
    monkeypatch.setattr(pretrain_module, "autocast", lambda device, dtype: seen.append(dtype) or real(device, dtype))
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    mlm = BertForMaskedLM(BertModel(tiny_config()))
    pretrain(mlm, tok, ["w1 w2 w3 w4", "w5 w6 w7"] * 4, PretrainConfig(max_steps=2, batch_size=4, device="cpu",
                                                                       bf16=bf16))
    assert seen == [want, want]


# ---- an interrupted pretraining resumes -------------------------------------------------------------------


def _resume_setup(tmp_path):
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    g = torch.Generator().manual_seed(0)
    sentences = [" ".join(f"w{j}" for j in torch.randint(0, 30, (int(n),), generator=g).tolist())
                 for n in torch.randint(3, 12, (16,), generator=g)]
    config = PretrainConfig(epochs=2, batch_size=4, lr=1e-3, max_length=16, seed=0, log_every=2)  # 8 steps
    return tok, sentences, config, make_eval_batches(tok, sentences[:6], max_length=16, batch_size=3, seed=5)


def _fresh_mlm(seed: int) -> BertForMaskedLM:
    torch.manual_seed(seed)  # the new model's init, then the dropout masks (tiny_config has dropout on)
    return BertForMaskedLM(BertModel(tiny_config()))


@pytest.mark.parametrize("crash_at", [5, 8])
def test_an_interrupted_pretraining_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, crash_at):
    """Killed during step ``crash_at`` (after the state of step 3, inside epoch 1, or of step 6, inside epoch 2),
    the same call again continues from the saved state: weights and records (but for speed) are the
    uninterrupted run's, bit for bit, although the process's RNG and the new model's init differ."""
    tok, sentences, config, eval_data = _resume_setup(tmp_path)
    whole = _fresh_mlm(0)
    want = pretrain(whole, tok, sentences, config, eval_data)

    state, real = tmp_path / "out.partial", mlm_module.mask_tokens
    monkeypatch.setattr(mlm_module, "mask_tokens", _dies_at(real, crash_at))  # the process is killed
    with pytest.raises(KeyboardInterrupt):
        pretrain(_fresh_mlm(0), tok, sentences, config, eval_data, run_dir=state, checkpoint_every=3)
    monkeypatch.setattr(mlm_module, "mask_tokens", real)
    cut = _fresh_mlm(123)
    got = pretrain(cut, tok, sentences, config, eval_data, run_dir=state, checkpoint_every=3)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), cut.state_dict().values()))
    speedless = [[{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rs] for rs in (want, got)]
    assert speedless[0] == speedless[1] and len(want) == 1 + 4 + 1


def test_a_resumed_log_window_reports_the_uninterrupted_speed(tmp_path, monkeypatch):
    """The log window open when the state was saved (step 3 of the window of steps 3-4) keeps its time: its
    tokens per second after the resume are the uninterrupted run's, not its tokens over the resumed part's
    time alone. A fake clock ticks one second per step, wherever the process is."""
    from types import SimpleNamespace

    tok, sentences, config, _ = _resume_setup(tmp_path)
    clock, real = [0.0], mlm_module.mask_tokens

    def ticking(*args, **kwargs):
        clock[0] += 1.0
        return real(*args, **kwargs)
    monkeypatch.setattr(pretrain_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(mlm_module, "mask_tokens", ticking)
    want = pretrain(_fresh_mlm(0), tok, sentences, config)
    state = tmp_path / "out.partial"
    monkeypatch.setattr(mlm_module, "mask_tokens", _dies_at(ticking, 5))
    with pytest.raises(KeyboardInterrupt):
        pretrain(_fresh_mlm(0), tok, sentences, config, run_dir=state, checkpoint_every=3)
    clock[0] += 1000.0  # the time between the kill and the new call is not training
    monkeypatch.setattr(mlm_module, "mask_tokens", ticking)
    got = pretrain(_fresh_mlm(0), tok, sentences, config, run_dir=state, checkpoint_every=3)
    assert [r["tokens_per_s"] for r in got] == [r["tokens_per_s"] for r in want]
    assert len(want) == 4 and all(r["tokens_per_s"] > 0 for r in want)


def test_a_checkpoint_whose_log_hook_kept_the_window_resumes_to_the_same_records(tmp_path, monkeypatch):
    """A checkpoint of the version whose log hook kept the open log window (state.json's hooks.PretrainLog:
    window_loss, window_steps, ...; the loop keeps it now, as log_window) resumes to the uninterrupted run's
    records: the window's loss and steps are taken from where that version saved them."""
    tok, sentences, config, eval_data = _resume_setup(tmp_path)
    want = pretrain(_fresh_mlm(0), tok, sentences, config, eval_data)
    state = tmp_path / "out.partial"
    monkeypatch.setattr(mlm_module, "mask_tokens", _dies_at(mlm_module.mask_tokens, 5))
    with pytest.raises(KeyboardInterrupt):
        pretrain(_fresh_mlm(0), tok, sentences, config, eval_data, run_dir=state, checkpoint_every=3)
    monkeypatch.undo()
    path = state / "checkpoints" / "last" / "state.json"
    saved = json.loads(path.read_text())
    window = saved.pop("log_window")
    assert window["steps"] == 1  # step 3 opened the window of steps 3-4
    saved["hooks"]["PretrainLog"].update({f"window_{k}": v for k, v in window.items()})
    path.write_text(json.dumps(saved))
    got = pretrain(_fresh_mlm(0), tok, sentences, config, eval_data, run_dir=state, checkpoint_every=3)
    speedless = [[{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rs] for rs in (want, got)]
    assert speedless[0] == speedless[1]


def test_the_resumable_state_of_an_earlier_version_is_refused_in_one_line(tmp_path):
    """<out-dir>.partial/state, the state an earlier version of the command kept, is not continued: one line says
    what to do, and it is left as it was."""
    tok, sentences, config, _ = _resume_setup(tmp_path)
    old = tmp_path / "out.partial" / "state"
    old.mkdir(parents=True)
    (old / "state.json").write_text(json.dumps({"identity": {}, "step": 3, "epoch": 0, "done_in_epoch": 3}))
    with pytest.raises(ValueError, match=r"out.partial/state holds a pretraining interrupted under an earlier "
                                         r"version of this command, which this one cannot continue: delete "
                                         r".*out.partial to start afresh"):
        pretrain(_fresh_mlm(0), tok, sentences, config, run_dir=tmp_path / "out.partial", checkpoint_every=3)
    assert sorted(p.name for p in old.iterdir()) == ["state.json"]


def test_a_saved_state_of_other_settings_is_refused(tmp_path, monkeypatch):
    """The state of an interrupted run is only continued by the same settings and data: anything else would
    train a mix of two runs. The error names what differs."""
    tok, sentences, config, _ = _resume_setup(tmp_path)
    state = tmp_path / "out.partial"
    monkeypatch.setattr(mlm_module, "mask_tokens", _dies_at(mlm_module.mask_tokens, 5))
    with pytest.raises(KeyboardInterrupt):
        pretrain(_fresh_mlm(0), tok, sentences, config, run_dir=state, checkpoint_every=3)
    assert (state / "checkpoints" / "last" / "state.json").is_file()
    other = PretrainConfig(**{**config.__dict__, "lr": 2e-3})
    with pytest.raises(ValueError, match=r"other settings or data \(config.lr: 0.001 there, 0.002 now\)"):
        pretrain(_fresh_mlm(0), tok, sentences, other, run_dir=state, checkpoint_every=3)
    with pytest.raises(ValueError, match="sentences: 16 there, 15 now"):
        pretrain(_fresh_mlm(0), tok, sentences[:15], config, run_dir=state, checkpoint_every=3)


def _dies_at(fn, n: int):
    """``fn``, but its ``n``-th call raises KeyboardInterrupt (a process killed there)."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return fn(*args, **kwargs)
    return wrapped
