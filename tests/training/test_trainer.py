"""Tests of tasks/training/trainer.py: the training loop, loss weights, learning-rate schedules and groups, the
optimizer paths, the data a trainer reads, exact resume.

Everything runs on a tiny random BERT (hidden 32, 2 layers, 4 heads, vocab 99)
saved as a HF-style checkpoint directory in tmp, with small synthetic task
files in the CS224N formats (``tiny_env``, tests/conftest.py), so the real code
path (load_pretrained, the tokenizer, the readers) is exercised end to end on
CPU in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import matplotlib.image
import pytest
import torch

from tasks.train_config import TrainConfig, check_resume_config
from tasks.data.datasets import move_batch
from tasks.model import ModelConfig
from tasks.objectives import REGISTRY, import_all
from tasks import checkpoint as ckpt_mod
from tasks.checkpoint import resolve_checkpoint
from tasks.storage import read_json
from tasks.training.optim import lr_scale
from tasks.training.trainer import Trainer
from tasks.training.run import build_parts, check_run, trainer_for
from tests.helpers import (DATA, OBJECTIVE_SETTINGS, Interrupt, StopAt, phrases, read_column,
                           tiny_train_config)

pytestmark = pytest.mark.usefixtures("one_thread")


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


def run_whole_and_cut(env, tmp_path: Path, stop_step: int, **overrides) -> tuple[Trainer, Trainer]:
    """(a whole run, the same run cut after global step ``stop_step`` and resumed), checked equal bit for bit."""
    full = trainer_for(tiny_train_config(env, tmp_path / "full", **overrides))
    full.fit()
    cfg = tiny_train_config(env, tmp_path / "cut", **overrides)
    with pytest.raises(Interrupt):
        trainer_for(cfg, hooks=[StopAt(step=stop_step)]).fit()
    resumed = trainer_for(cfg, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    resumed.fit()
    _assert_same_state(full, resumed)
    return full, resumed


# ---- the loop -------------------------------------------------------------------------------------------


def test_a_few_epochs_reduce_the_loss(tiny_env, tmp_path):
    """Training lowers every task's mean head loss from the first epoch to the last and logs every term."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=4, lr=2e-3, warmup=0.0)
    trainer = trainer_for(cfg)
    trainer.fit()
    first, last = trainer.history[0]["train"], trainer.history[-1]["train"]
    assert set(first) == {"loss", "sst/loss", "para/loss", "sts/loss"}
    for term in first:
        assert last[term] < first[term], (term, first[term], last[term])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert {"sst_acc", "para_acc", "sts_r", "overall"} <= set(records[0]["dev"])
    assert matplotlib.image.imread(tmp_path / "run" / "training.png").shape[:2] == (675, 990)


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_loss_weights_scale_the_task_gradients(tiny_env, tmp_path, weight):
    """A stream's loss weight multiplies its gradients: weight 0 gives exactly zero gradients, 2 doubles them."""
    base = trainer_for(tiny_train_config(tiny_env, tmp_path / "a"))
    weighted = trainer_for(tiny_train_config(tiny_env, tmp_path / "b", loss_weights={"para": weight}))
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


def test_phrases_train_the_sst_head_at_their_rate_and_weight(tiny_env, tmp_path):
    """--sst-phrases: each epoch trains sst_phrases_per_epoch phrases (the next ones of a shuffle: two epochs see
    different phrases), in batches of the SST head whose loss is the phrases' weight x the SST loss; the sentences
    still train in full, and with order "first" the phrase batches open the epoch."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", **phrases(per_epoch=20, batch_size=8, min_words=2, weight=0.25),
                            train_subsets="cycle")
    trainer = trainer_for(cfg)
    stream = trainer.train_sets["phrases"]
    assert len(stream) > 20 and min(len(t.split()) for t in stream.texts) >= 2
    plans = [trainer.schedule.epoch_plan(e) for e in range(2)]
    seen = [[i for s, b in plan if s == "phrases" for i in b] for plan in plans]
    assert [len(x) for x in seen] == [20, 20] and len(set(seen[0] + seen[1])) == 40
    assert sorted(i for s, b in plans[0] if s == "sst" for i in b) == list(range(len(trainer.train_sets["sst"])))
    trainer.model.eval()
    batch = stream.collate(seen[0][:8])
    loss, terms = trainer.step_loss("phrases", batch)
    head = trainer.model.task_loss("sst", trainer.model("sst", batch), batch)
    assert set(terms) == {"phrases/loss"} and torch.equal(terms["phrases/loss"], head)
    assert loss.item() == pytest.approx(0.25 * head.item())
    first = trainer_for(dataclasses.replace(cfg, out_dir=str(tmp_path / "first"),
                                            stream_orders={"phrases": "first"}))
    plan = first.schedule.epoch_plan(0)
    assert [s for s, _ in plan[:3]] == ["phrases"] * 3 and "phrases" not in {s for s, _ in plan[3:]}


def test_phrases_take_their_own_batch_size_under_even_batching(tiny_env, tmp_path):
    """--sst-phrases-batch-size: the phrase stream's batches hold that many phrases, shuffled among the tasks'
    batches of --batch-size (even batching), the epoch's phrases unchanged in number."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", **phrases(per_epoch=24, batch_size=12))
    plan = trainer_for(cfg).schedule.epoch_plan(0)
    sizes: dict[str, set[int]] = {}
    for stream, batch in plan:
        sizes.setdefault(stream, set()).add(len(batch))
    assert sizes.pop("phrases") == {12} and max(map(max, sizes.values())) == cfg.batch_size == 8




def test_the_phrase_streams_general_settings_take_effect(tiny_env, tmp_path):
    """The phrase stream takes the per-stream settings every stream has: --loss-weights phrases=W,
    --max-train-examples phrases=N and --task-batch-size phrases=B act as --sst-phrases-weight, -per-epoch and
    -batch-size (the SST entry's spellings of the same settings), never silently ignored."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", stream_files={"phrases": "sst-phrases-train.csv"},
                            schedule="round_robin", loss_weights={"phrases": 0.5},
                            max_train_examples={"phrases": 12}, task_batch_size={"phrases": 4})
    trainer = trainer_for(cfg)
    plan = trainer.schedule.epoch_plan(0)
    phrases = [b for s, b in plan if s == "phrases"]
    assert sum(map(len, phrases)) == 12 and {len(b) for b in phrases} == {4}
    assert trainer.weights.get("phrases") == 0.5


def test_learning_rate_schedules(tiny_env, tmp_path):
    """constant stays; epoch_decay is lr - decay·epoch (paper §4.5); warmup_linear rises then decays to ~0."""
    def trainer(**settings):
        return trainer_for(tiny_train_config(tiny_env, tmp_path / str(len(list(tmp_path.iterdir()))), lr=1e-5,
                                             **settings))

    t = trainer(lr_schedule="epoch_decay", lr_decay=4e-7, epochs=4)
    assert t.lr_at(0, 5, 10) == 1e-5 and t.lr_at(3, 0, 10) == pytest.approx(1e-5 - 3 * 4e-7)
    assert trainer(lr_schedule="constant").lr_at(1, 3, 10) == 1e-5
    t = trainer(lr_schedule="warmup_linear", warmup=0.25, epochs=2)
    lrs = [t.lr_at(e, s, 10) for e in range(2) for s in range(10)]
    assert lrs[4] == pytest.approx(1e-5) and lrs[0] < lrs[1] < lrs[4]
    assert all(a > b for a, b in zip(lrs[5:], lrs[6:])) and 0 < lrs[-1] < 1e-6


def test_optimizer_excludes_biases_and_layernorm_from_weight_decay(tiny_env, tmp_path):
    """AdamW groups: matrices decay, biases and LayerNorm weights (1-D) do not."""
    t = trainer_for(tiny_train_config(tiny_env, tmp_path / "r", weight_decay=0.05))
    decay, no_decay = t.optimizer.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    names = dict(zip(map(id, t.params), t.param_names))
    assert any("LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert len(t.params) == sum(1 for p in t.model.parameters() if p.requires_grad)


def test_encoder_dropout_reaches_the_encoder_and_cpu_bf16_trains(tiny_env, tmp_path):
    """encoder_dropout sets every dropout inside the encoder (not only the heads); bf16 autocast trains on CPU."""
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / "run", epochs=1, encoder_dropout=0.25, bf16=True))
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
    trainers = [trainer_for(tiny_train_config(tiny_env, tmp_path / str(c), tasks=("sst",), encoder_dropout=0.0,
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
        t = trainer_for(tiny_train_config(tiny_env, tmp_path / f"run{fused}", epochs=2, fused_adamw=fused))
        assert all(g["fused"] is fused and g["foreach"] is not fused for g in t.optimizer.param_groups)
        t.fit()
        trainers.append(t)
    a, b = trainers
    for ra, rb in zip(a.history, b.history):
        for k in ra["train"]:
            assert abs(ra["train"][k] - rb["train"][k]) < 1e-4, k
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-4, rtol=1e-4, msg=n)


def test_fused_adamw_is_the_default_and_the_foreach_path_stays_selectable(tiny_env, tmp_path):
    """TrainConfig() trains with the fused kernel; fused_adamw=False (--no-fused-adamw) builds the foreach path."""
    assert TrainConfig().fused_adamw is True
    t = trainer_for(tiny_train_config(tiny_env, tmp_path / "default", epochs=1))
    assert all(g["fused"] and not g["foreach"] for g in t.optimizer.param_groups)
    t = trainer_for(tiny_train_config(tiny_env, tmp_path / "foreach", epochs=1, fused_adamw=False))
    assert all(g["foreach"] and not g["fused"] for g in t.optimizer.param_groups)


def test_gradient_checkpointing_trains_exactly_as_without(tiny_env, tmp_path):
    """gradient_checkpointing=True recomputes each encoder layer in backward (dropout on: the recomputation must
    draw the same masks): the same epoch losses and final weights as storing the activations."""
    trainers = []
    for ckpt in (False, True):
        t = trainer_for(tiny_train_config(tiny_env, tmp_path / f"run{ckpt}", epochs=1, encoder_dropout=0.1,
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


def test_prefetched_batches_equal_batches_collated_in_line(tiny_env, tmp_path):
    """The background-thread prefetch (on by default on CUDA) yields the same batches in the same order as
    collating in line, from any start step, and stops at the end of the plan."""
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / "run"))
    plan = trainer.schedule.epoch_plan(0)
    for start in (0, 5, len(plan) - 1, len(plan)):
        trainer.prefetch = False
        inline = list(trainer.batches(plan, start))
        trainer.prefetch = True
        ahead = list(trainer.batches(plan, start))
        assert len(inline) == len(ahead) == len(plan) - start
        for (s1, b1, w1), (s2, b2, w2) in zip(inline, ahead):
            assert (s1, w1, b1.keys()) == (s2, w2, b2.keys())
            for k, v in b1.items():
                assert torch.equal(v, b2[k]) if isinstance(v, torch.Tensor) else v == b2[k]


# ---- what the trainer reads and builds ------------------------------------------------------------------


def test_limit_caps_every_split(tiny_env, tmp_path):
    """limit=N reads at most N examples of every split of every task, NLI included, and predictions follow."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, limit=10, nli=True,
                            objectives={"mnr": {}}, model=ModelConfig(arch="b1", pair_encoding="siamese", fcn_size=16))
    trainer = trainer_for(cfg)
    assert {s: len(d) for s, d in trainer.train_sets.items()} == {"sst": 10, "para": 10, "sts": 10, "nli": 10}
    assert {t: len(d) for t, d in trainer.dev_sets.items()} == {"sst": 10, "para": 10, "sts": 10}
    trainer.fit()
    assert "nli/mnr.loss" in trainer.history[0]["train"]
    assert "nli/loss" not in trainer.history[0]["train"]  # the NLI stream has no head loss


def test_dev_subset_between_epochs_is_fixed(tiny_env, tmp_path):
    """dev_max_examples scores a fixed subset between epochs; the final evaluation reads the whole dev set."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, dev_max_examples={"para": 8})
    t1, t2 = trainer_for(cfg), trainer_for(cfg, overwrite=True)
    assert len(t1.dev_sets["para"]) == 8 and t1.dev_sets["para"].ids == t2.dev_sets["para"].ids
    assert len(t1.dev_sets["sst"]) == 24


def test_build_parts_starts_the_baseline_para_offset_from_training_pairs(tmp_path):
    read_column("quora-train.csv", ("id",), 1)  # skips where setup.sh has not linked the data
    cfg = TrainConfig(data_dir=str(DATA), limit=64, tasks=("para",), out_dir=str(tmp_path),
                      model=ModelConfig(arch="baseline", pair_encoding="siamese", pooling="mean"))
    parts = build_parts(cfg, torch.device("cpu"))
    ds = parts.train_sets["para"]
    batch = ds.collate(range(len(ds)))
    p = batch["labels"].float().mean().item()
    with torch.no_grad():
        z = parts.model.eval()("para", batch).logits
    assert z.mean().item() == pytest.approx(math.log(p / (1 - p)), abs=1e-3)


@pytest.mark.parametrize("pooling", ["mean", "pooler"])
def test_reinit_layers_redraws_the_top_layers_alone_and_the_pooler_where_the_heads_read_it(tiny_env, tmp_path, pooling):
    """--reinit-layers 1 on the tiny 2-layer encoder: layer 1 (and the pooler with pooling=pooler) differ from the
    pretrained weights; layer 0, the embeddings and the heads (drawn before) are those of a run without it."""
    model = ModelConfig(arch="b1", pair_encoding="cross", pooling=pooling)
    plain, reinit = (build_parts(tiny_train_config(tiny_env, tmp_path / str(n), reinit_layers=n, model=model),
                                 torch.device("cpu")).model.state_dict() for n in (0, 1))
    redrawn = {k for k in plain if not torch.equal(plain[k], reinit[k])}
    assert redrawn and all(k.startswith(("encoder.encoder.layer.1.", "encoder.pooler.")) for k in redrawn)
    assert any(k.startswith("encoder.pooler.") for k in redrawn) == (pooling == "pooler")
    with pytest.raises(ValueError, match="--reinit-layers 3: the encoder in .* has 2 layers"):  # before any data
        check_run(tiny_train_config(tiny_env, tmp_path / "3", reinit_layers=3))


# ---- layer-wise lr decay and the heads' lr scale (--layer-lr-decay, --head-lr-scale) ----------------------


def test_default_keeps_two_groups_at_one_lr(tiny_env, tmp_path):
    """Both factors at 1: the two weight-decay groups of before, no lr_scale key (the default's numbers unchanged)."""
    t = trainer_for(tiny_train_config(tiny_env, tmp_path / "r"))
    assert len(t.optimizer.param_groups) == 2
    assert all("lr_scale" not in g for g in t.optimizer.param_groups)


def test_every_parameter_takes_its_scaled_lr_in_a_step(tiny_env, tmp_path):
    """After a step each parameter's group has lr × its scale, weight decay still only on matrices, none left out."""
    t = trainer_for(tiny_train_config(tiny_env, tmp_path / "r", layer_lr_decay=0.5, head_lr_scale=4.0,
                                              weight_decay=0.05))
    layers = t.model.encoder.config.num_hidden_layers
    t.train_step("sst", t.train_sets["sst"].collate(list(range(8))), lr=1e-3)
    group_of = {id(p): g for g in t.optimizer.param_groups for p in g["params"]}
    assert len(group_of) == len(t.params) == sum(1 for p in t.model.parameters() if p.requires_grad)
    seen = set()
    for name, p in zip(t.param_names, t.params):
        g = group_of[id(p)]
        assert g["lr"] == pytest.approx(1e-3 * lr_scale(name, layers, 0.5, 4.0)), name
        assert g["weight_decay"] == (0.05 if p.ndim >= 2 else 0.0), name
        seen.add(g["lr"])
    assert min(seen) == pytest.approx(1e-3 * 0.5 ** layers) and max(seen) == pytest.approx(4e-3)


def test_frozen_lower_layers_move_less(tiny_env, tmp_path):
    """A tiny layer decay barely moves the embeddings while the top layer trains as without decay."""
    runs = {}
    for decay in (1.0, 1e-4):
        t = trainer_for(tiny_train_config(tiny_env, tmp_path / str(decay), layer_lr_decay=decay, epochs=1))
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        t.fit()
        runs[decay] = {n: (p.detach() - before[n]).abs().max().item() for n, p in t.model.named_parameters()}
    emb = "encoder.embeddings.word_embeddings.weight"
    assert runs[1e-4][emb] < 1e-3 * runs[1.0][emb]
    top = [n for n in runs[1.0] if n.startswith("encoder.encoder.layer.1.")]
    assert all(runs[1e-4][n] > 0 for n in top)


# ---- checkpoints and exact resume ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["mid-epoch", "epoch-end"])
def test_resume_is_bit_identical(tiny_env, tmp_path, where):
    """A run interrupted and resumed from its checkpoint ends with the same weights and optimizer state, bit for bit."""
    full = trainer_for(tiny_train_config(tiny_env, tmp_path / "full", checkpoint_every=4))
    full.fit()
    cfg = tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4)
    stop = StopAt(step=9) if where == "mid-epoch" else StopAt(epoch=1)
    with pytest.raises(Interrupt):
        trainer_for(cfg, hooks=[stop]).fit()
    last = tmp_path / "cut" / "checkpoints" / "last"
    state = read_json(last / "state.json")
    if where == "mid-epoch":
        assert (state["epoch"], state["global_step"]) == (0, 8) and state["step"] == 8
    else:
        assert (state["epoch"], state["step"]) == (1, 0)
    resumed = trainer_for(cfg, resume_from=last)
    resumed.fit()
    _assert_same_state(full, resumed)
    assert [r["train"] for r in resumed.history] == [r["train"] for r in full.history]
    assert [r["dev"] for r in resumed.history] == [r["dev"] for r in full.history]
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]


def test_deterministic_run_resumes_bit_identically(tiny_env, tmp_path, restore_determinism):
    """--deterministic (the CUDA resume guarantee, tasks/runtime.py) reaches torch, and training and resuming with
    it on stays bit-exact on CPU."""
    cfg_full = tiny_train_config(tiny_env, tmp_path / "full", checkpoint_every=4, deterministic=True)
    full = trainer_for(cfg_full)
    assert torch.are_deterministic_algorithms_enabled()
    full.fit()
    cfg = tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4, deterministic=True)
    with pytest.raises(Interrupt):
        trainer_for(cfg, hooks=[StopAt(step=9)]).fit()
    resumed = trainer_for(cfg, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    resumed.fit()
    _assert_same_state(full, resumed)
    with pytest.raises(ValueError, match="deterministic"):  # not a field a resume may change
        check_resume_config(cfg, tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4))


@pytest.mark.parametrize("objective", ["simcse", "knn_bert"])
def test_resume_with_objective_state_is_bit_identical(tiny_env, tmp_path, objective):
    """Objectives' terms and state (KNN-BERT's queues and momentum encoder) survive a resume bit for bit."""
    kw = dict(objectives={objective: {}}, checkpoint_every=5, epochs=1)
    if objective == "knn_bert":
        kw["objectives"] = {objective: {"m_most": 2, "m_least": 2, "queue_size": 20}}
    full, resumed = run_whole_and_cut(tiny_env, tmp_path, 6, **kw)
    a, b = full.objectives[0].state_dict(), resumed.objectives[0].state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(k.startswith(f"{objective}/") or "/" + objective in k for k in full.history[0]["train"])


def test_resume_with_phrases_draws_the_same_phrases(tiny_env, tmp_path):
    """A run with --sst-phrases cut mid-epoch and resumed trains the same phrase batches as the whole run: it ends
    with the same weights and the same per-epoch phrase losses, bit for bit."""
    full, resumed = run_whole_and_cut(tiny_env, tmp_path, 9, **phrases(per_epoch=24), checkpoint_every=4)
    assert [r["train"]["phrases/loss"] for r in full.history] == [r["train"]["phrases/loss"] for r in resumed.history]


def test_resume_with_lr_groups_is_bit_identical(tiny_env, tmp_path):
    """The groups' lr scales survive a checkpoint: a cut and resumed run ends exactly where the whole run does."""
    full, resumed = run_whole_and_cut(tiny_env, tmp_path, 9, layer_lr_decay=0.7, head_lr_scale=2.0,
                                      checkpoint_every=4)
    scales = [[g.get("lr_scale", 1.0) for g in t.optimizer.param_groups] for t in (full, resumed)]
    assert scales[0] == scales[1] and len(set(scales[0])) > 1


def test_failed_checkpoint_write_keeps_the_previous_one(tiny_env, tmp_path, monkeypatch):
    """Trainer.save_checkpoint failing half-way keeps the old 'last' complete and loadable."""
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / "run", epochs=1))
    trainer.fit()
    last = trainer.run_dir.checkpoints / "last"
    before = (last / "model.safetensors").read_bytes()
    calls, real = [], ckpt_mod.save_tensors

    def failing(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("no space left on device")
        real(path, tensors, metadata)

    monkeypatch.setattr(ckpt_mod, "save_tensors", failing)
    trainer.global_step += 1
    with pytest.raises(OSError):
        trainer.save_checkpoint("last")
    assert (last / "model.safetensors").read_bytes() == before
    assert resolve_checkpoint(last) == last
    assert sorted(p.name for p in trainer.run_dir.checkpoints.iterdir()) == ["best", "last"]


def test_fresh_run_refuses_existing_checkpoints(tiny_env, tmp_path):
    """A fresh run into a directory with checkpoints raises unless overwrite is set."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    trainer_for(cfg).fit()
    with pytest.raises(FileExistsError, match="--resume"):
        trainer_for(cfg)
    trainer_for(cfg, overwrite=True)


def test_resume_refuses_a_changed_config(tiny_env, tmp_path):
    """Resuming with a different learning rate is refused; more epochs or another device is allowed."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, lr_schedule="constant")
    trainer_for(cfg).fit()
    last = tmp_path / "run" / "checkpoints" / "last"
    with pytest.raises(ValueError, match="lr"):
        trainer_for(dataclasses.replace(cfg, lr=5e-4), resume_from=last)
    t = trainer_for(dataclasses.replace(cfg, epochs=2, log_every=3), resume_from=last)
    assert t.epoch == 1


# ---- on a GPU (marker ``gpu``; tests/conftest.py skips it where torch.cuda.is_available() is False) ---------
# A few training steps of the tiny model, with each objective, run under ``torch.cuda.set_sync_debug_mode("error")``,
# so any host synchronization in the hot path (``.item()``, a blocking copy, boolean indexing) raises instead of
# stalling the GPU. The two-process test on NCCL lives in tests/training/test_distributed.py.


import_all()
# distill needs teacher files written per test; its hot path is covered by tests/objectives/test_init.py.
CASES = [None, *sorted(k for k, v in OBJECTIVE_SETTINGS.items() if v is not None)]


@pytest.mark.gpu
@pytest.mark.parametrize("objective", CASES)
@pytest.mark.parametrize("bf16", [False, True])
def test_training_steps_make_no_host_sync(tiny_env, tmp_path, objective, bf16):
    """Four training steps (after one outside, which may initialize lazily) raise no host synchronization."""
    if bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bf16")
    objectives = {} if objective is None else {objective: OBJECTIVE_SETTINGS[objective]}
    siamese = objective is not None and REGISTRY[objective].needs_siamese
    model = ModelConfig(arch="b1", pair_encoding="siamese" if siamese else "cross", fcn_size=16, head_dropout=0.1)
    cfg = tiny_train_config(tiny_env, tmp_path, device="cuda", bf16=bf16, objectives=objectives, epochs=1,
                            model=model)
    trainer = trainer_for(cfg)
    trainer.model.train()
    plan = trainer.schedule.epoch_plan(0)[:5]
    batches = [(s, move_batch(trainer.train_sets[s].collate(idx), trainer.device)) for s, idx in plan]
    trainer.train_step(*batches[0], cfg.lr)
    torch.cuda.synchronize(trainer.device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for stream, batch in batches[1:]:
            trainer.train_step(stream, batch, cfg.lr)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(trainer.device)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
