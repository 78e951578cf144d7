"""Tests of tasks/model.py: head shapes, gradient routing, the paper's formulas, float32 heads under bf16
autocast, module modes, config checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from minbert.bert import BertModel
from tasks.data.datasets import PairDataset, SentenceDataset
from tasks.data.readers import Example
from tasks.evaluation.evaluator import predict_dataset
from tasks.model import ModelConfig, MultitaskBert, preserved_modes
from tasks.task import KINDS, MULTITASK as TASKS, Layout, Task, Tasks
from tests.helpers import WordTokenizer, make_dataset, make_model, tiny_config, tiny_model

SENTENCES = [
    "a gripping and funny film",
    "dull",
    "the plot is thin and the acting is somehow worse than the script it was given",
    "not bad at all",
    "one of the best movies of the year",
    "i wanted to leave after ten minutes",
]
PAIRS = [(SENTENCES[i], SENTENCES[(i + 2) % len(SENTENCES)]) for i in range(len(SENTENCES))]
B = len(SENTENCES)
TOK = WordTokenizer()
GRID = [(arch, enc) for arch in ("baseline", "b1") for enc in ("siamese", "cross")]
pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(task: str, pair_encoding: str = "siamese") -> dict:
    """A collated, labeled batch of all B examples for ``task``."""
    if task == "sst":
        ex = [Example(str(i), s, None, i % 5) for i, s in enumerate(SENTENCES)]
        return SentenceDataset(ex, TOK).collate(range(B))
    labels = [float(i % 2) if task == "para" else 0.8 * i for i in range(B)]
    ex = [Example(str(i), a, b, y) for i, ((a, b), y) in enumerate(zip(PAIRS, labels))]
    return PairDataset(ex, TOK, mode=pair_encoding).collate(range(B))


def head_modules(model: MultitaskBert, task: str) -> list[str]:
    """Names of the non-encoder submodules ``task`` should train."""
    own = [f"{task}_head"] if model.config.arch == "baseline" else ["shared", f"{task}_own", f"{task}_head"]
    return [name for name in own if list(getattr(model, name).parameters())]


def grad_norm(module: torch.nn.Module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_logit_shapes_and_sts_range(arch, pair_encoding):
    """Logits are SST (B, 5), paraphrase (B,), STS (B,) within [0, 5] (the baseline's Siamese 5·cos: [-5, 5])."""
    model = make_model(arch, pair_encoding).eval()
    assert model("sst", make_batch("sst")).logits.shape == (B, 5)
    assert model("para", make_batch("para", pair_encoding)).logits.shape == (B,)
    sts = model("sts", make_batch("sts", pair_encoding)).logits
    assert sts.shape == (B,)
    # b1's STS embeddings are post-ReLU (cosine >= 0) and cross uses 5·sigmoid; the
    # baseline's linear projections can point apart, as the paper's 5·cosine allows.
    low = -5.0 if (arch, pair_encoding) == ("baseline", "siamese") else 0.0
    assert bool(((sts >= low) & (sts <= 5.0)).all())


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_task_loss_gradients_reach_encoder_and_own_head_only(arch, pair_encoding):
    """Each task's loss is finite and its gradient reaches the encoder and that task's head, never another task's."""
    model = make_model(arch, pair_encoding).train()
    for task in TASKS:
        model.zero_grad(set_to_none=True)
        batch = make_batch(task, pair_encoding)
        loss = model.task_loss(task, model(task, batch), batch)
        assert loss.ndim == 0 and torch.isfinite(loss)
        loss.backward()
        assert grad_norm(model.encoder.embeddings) > 0 and grad_norm(model.encoder.pooler) > 0
        mine = head_modules(model, task)
        for name in mine:
            for pname, p in getattr(model, name).named_parameters():
                assert p.grad is not None and float(p.grad.abs().sum()) > 0, f"{task}: no gradient for {name}.{pname}"
        for other in TASKS:
            for name in head_modules(model, other):
                if name not in mine:
                    assert grad_norm(getattr(model, name)) == 0, f"{task} loss leaked into {name}"


@pytest.mark.parametrize("pair_encoding", ["siamese", "cross"])
def test_b1_shared_layers_trained_by_every_task(pair_encoding):
    """B1's shared FCN layers receive gradient from the SST, paraphrase and STS losses alike."""
    model = make_model("b1", pair_encoding).train()
    for task in TASKS:
        model.zero_grad(set_to_none=True)
        batch = make_batch(task, pair_encoding)
        model.task_loss(task, model(task, batch), batch).backward()
        for pname, p in model.shared.named_parameters():
            assert p.grad is not None and float(p.grad.abs().sum()) > 0, f"{task}: shared.{pname} got no gradient"


def test_baseline_sts_is_five_times_cosine_of_projections():
    """Baseline STS (paper §4.1) = 5 · cos(W e1 + b, W e2 + b) of the pooled [CLS] embeddings."""
    model = make_model("baseline", "siamese").eval()
    batch = make_batch("sts")
    out = model("sts", batch)
    with torch.no_grad():
        pooled = [model.encoder(input_ids=batch[f"input_ids{s}"], attention_mask=batch[f"attention_mask{s}"],
                                token_type_ids=batch[f"token_type_ids{s}"])["pooler_output"] for s in ("_1", "_2")]
        (linear,) = [m for m in model.sts_head if isinstance(m, torch.nn.Linear)]
        assert linear.out_features == model.config.baseline_proj_size
        u, v = (e @ linear.weight.T + linear.bias for e in pooled)  # (B, 32)
        expected = 5.0 * (u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1))
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.features["cos_1"], u)


def test_baseline_para_is_dot_product_of_projections_plus_a_learned_offset():
    """Baseline paraphrase logit (paper §4.1) = (W e1 + b) · (W e2 + b) + c, with c a trained scalar.

    Without c the threshold sits at a dot product of 0, where two similar sentences'
    projections start out (mean-pooled MiniLM embeddings of any two questions point
    alike): a short run predicted "paraphrase" for 95% of Quora dev, below the majority class.
    """
    model = make_model("baseline", "siamese").eval()
    batch = make_batch("para")
    with torch.no_grad():
        model.para_bias.fill_(-0.75)
    out = model("para", batch)
    with torch.no_grad():
        u, v = model.para_head(out.features["pooled_1"]), model.para_head(out.features["pooled_2"])
    torch.testing.assert_close(out.logits, (u * v).sum(-1) - 0.75)
    out.logits.sum().backward()
    assert model.para_bias.grad is not None and model.para_bias.grad.item() == pytest.approx(len(out.logits))


def test_baseline_para_offset_starts_at_the_log_odds_of_its_batch():
    """The offset's data-dependent start: the initial logits average log(p / (1 - p)) of the batch's
    paraphrase rate p, wherever the dot products start (all positive on real sentences)."""
    model = make_model("baseline", "siamese").train()
    batch = make_batch("para")
    batch["labels"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # p = 1/3
    model.init_offset("para", batch)
    assert model.training  # restored
    with torch.no_grad():
        out = model.eval()("para", batch)
    assert out.logits.mean().item() == pytest.approx(math.log(0.5), abs=1e-5)


@pytest.mark.parametrize("pair_encoding", ["siamese", "cross"])
def test_b1_relu_layers_keep_the_signal_scale_at_init(pair_encoding):
    """Every head layer that feeds a ReLU starts He-initialized (std √(2/fan_in)), so unit-scale
    features stay unit-scale through b1's stacks and the logits start spread out.

    With BERT's std 0.02 alone each ReLU layer shrank the signal ~4x (0.02 · √(256/2)), b1's
    logits started within ~1e-3 of one another, and a one-epoch cross-encoded run (seed 1)
    never left that start: STS r 0.46, Quora at the majority class.
    """
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="b1", pair_encoding=pair_encoding))
    x = torch.randn(4096, model.encoder.config.hidden_size)  # unit-scale pooled embeddings
    with torch.no_grad():
        for task in TASKS:
            f = model._features(task, x)  # [shared (two ReLU layers), own (one)]
            assert 0.7 < f.pow(2).mean().sqrt() < 1.4, task
        assert model.sst_head(model._features("sst", x)).std(0).min() > 0.1
        if pair_encoding == "cross":
            for task in ("para", "sts"):
                assert getattr(model, f"{task}_head")(model._features(task, x)).std() > 0.1, task
        # the layers to logits and the Siamese projections keep BERT's std 0.02
        last = model.sst_head[-1].weight
        assert 0.015 < last.std() < 0.025


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_eval_outputs_deterministic_without_head_dropout(arch, pair_encoding):
    """head_dropout=0: two eval passes are bit-identical (train mode too when the encoder has no dropout)."""
    for train, dropout in ((False, None), (True, 0.0)):
        model = make_model(arch, pair_encoding, dropout=dropout, head_dropout=0.0).train(train)
        for task in TASKS:
            batch = make_batch(task, pair_encoding)
            assert torch.equal(model(task, batch).logits, model(task, batch).logits), (task, train)


def test_head_dropout_is_active_in_train_mode():
    """head_dropout > 0 changes train-mode outputs even with encoder dropout off (the flag does something)."""
    model = make_model("baseline", dropout=0.0, head_dropout=0.3).train()
    batch = make_batch("sst")
    assert not torch.equal(model("sst", batch).logits, model("sst", batch).logits)


class PooledFn(nn.Module):
    """A pooled transform from a plain function (the model's transforms are parameter-free modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, e):
        return self.fn(e)


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_a_pooled_transform_sees_each_pooled_embedding(arch, pair_encoding):
    """``set_pooled_transform`` sees each pooled (B, H) embedding of its task only: identity keeps the output,
    zeros change it; a transform with parameters is refused (the checkpoint has no place for them)."""
    for task in TASKS:
        model = make_model(arch, pair_encoding).eval()
        batch = make_batch(task, pair_encoding)
        plain = model(task, batch)
        seen = []

        def identity(e):
            seen.append(e)
            return e

        model.set_pooled_transform(task, PooledFn(identity))
        same = model(task, batch)
        assert torch.equal(same.logits, plain.logits)
        pooled = [v for k, v in plain.features.items() if k.startswith("pooled")]
        assert len(seen) == len(pooled) and all(torch.equal(a, b) for a, b in zip(seen, pooled))
        assert all(e.shape == (B, model.encoder.config.hidden_size) for e in seen)
        other = next(t for t in TASKS if t != task)
        model(other, make_batch(other, pair_encoding))
        assert len(seen) == len(pooled)  # another task's forward is untouched
        model.set_pooled_transform(task, PooledFn(torch.zeros_like))
        assert not torch.allclose(model(task, batch).logits, plain.logits), task
        assert model.state_dict().keys() == make_model(arch, pair_encoding).state_dict().keys()
    with pytest.raises(ValueError, match="may not hold parameters"):
        model.set_pooled_transform("sst", nn.Linear(2, 2))


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_inputs_embeds_path_equals_ids_path(arch, pair_encoding):
    """The word embeddings of the ids give the ids' logits; perturbed embeddings change them (they are used)."""
    model = make_model(arch, pair_encoding, pooling="mean").eval()
    for task in TASKS:
        batch = make_batch(task, pair_encoding)
        suffixes = [k[len("input_ids"):] for k in batch if k.startswith("input_ids")]
        embeds = {s: model.encoder.embed_tokens(batch["input_ids" + s]) for s in suffixes}
        plain = model(task, batch).logits
        torch.testing.assert_close(model(task, batch, inputs_embeds=embeds).logits, plain, atol=1e-6, rtol=1e-6)
        noisy = {s: e + 0.5 * torch.randn_like(e) for s, e in embeds.items()}
        assert not torch.allclose(model(task, batch, inputs_embeds=noisy).logits, plain, atol=1e-4), task


@pytest.mark.parametrize("bad", [
    dict(arch="b2"), dict(pair_encoding="dual"), dict(pooling="max"), dict(head_dropout=1.0),
    dict(head_dropout=-0.1), dict(fcn_size=0), dict(baseline_proj_size=0), dict(spans={"sts": 0.0}),
])
def test_model_config_rejects_bad_values(bad):
    """ModelConfig raises ValueError on a value it does not implement, naming the field."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        ModelConfig(**bad)


def test_model_config_rejects_unknown_field_and_pooler_without_pooler():
    """An unknown config key is an error; pooling='pooler' needs an encoder that has a pooler."""
    with pytest.raises(TypeError):
        ModelConfig(dropout=0.1)
    with pytest.raises(ValueError, match="pooler"):
        MultitaskBert(BertModel(tiny_config(), add_pooling_layer=False), ModelConfig(pooling="pooler"))
    MultitaskBert(BertModel(tiny_config(), add_pooling_layer=False), ModelConfig(pooling="cls"))


def test_pair_batch_must_match_pair_encoding():
    """A Siamese batch given to a cross model (and the reverse) raises instead of mis-scoring silently."""
    for arch in ("baseline", "b1"):
        cross, siamese = make_model(arch, "cross").eval(), make_model(arch, "siamese").eval()
        for task in ("para", "sts"):
            with pytest.raises(ValueError, match="pair_encoding"):
                cross(task, make_batch(task, "siamese"))
            with pytest.raises(ValueError, match="pair_encoding"):
                siamese(task, make_batch(task, "cross"))


def test_mean_pooling_ignores_padding():
    """pooling='mean' averages real tokens only: a sentence padded in a batch embeds as it does alone."""
    model = make_model(pooling="mean").eval()
    batch = make_batch("sst")
    lengths = batch["attention_mask"].sum(1)
    assert int(lengths.min()) < batch["input_ids"].shape[1]  # the batch has padding
    with torch.no_grad():
        batched = model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        for i in range(B):
            n = int(lengths[i])
            alone = model.embed(batch["input_ids"][i : i + 1, :n], batch["attention_mask"][i : i + 1, :n],
                                batch["token_type_ids"][i : i + 1, :n])
            torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=1e-5)
            h = model.encoder(input_ids=batch["input_ids"][i : i + 1, :n])["last_hidden_state"]
            torch.testing.assert_close(alone, h.mean(1), atol=1e-6, rtol=1e-6)


def _linear(m: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return x @ m.weight.T + m.bias


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def _b1_features(model: MultitaskBert, task: str, e: torch.Tensor) -> torch.Tensor:
    """B1's [shared, own] by hand: shared = ReLU(W2 ReLU(W1 e + b1) + b2), own = ReLU(W e + b) (§4.3)."""
    s1, s2 = _linears(model.shared)
    (own,) = _linears(getattr(model, f"{task}_own"))
    shared = torch.relu(_linear(s2, torch.relu(_linear(s1, e))))
    return torch.cat([shared, torch.relu(_linear(own, e))], dim=-1)


def _b1_mlp(head: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    h1, h2 = _linears(head)
    return _linear(h2, torch.relu(_linear(h1, x)))


@pytest.mark.parametrize("pair_encoding", ["siamese", "cross"])
def test_b1_para_and_sts_heads_equal_hand_computation(pair_encoding):
    """B1 heads recomputed from the layer weights on the pooled embeddings. Siamese paraphrase (the structural
    change): MLP([f1 ⊙ f2, e1, e2]) with f = [shared, own]; Siamese STS: 5 · cos(f1, f2); cross: paraphrase
    MLP([shared, own]) of the pair's embedding, STS 5 · σ(MLP([shared, own]))."""
    model = make_model("b1", pair_encoding, head_dropout=0.0).eval()
    # The tiny encoder's pooled embeddings barely differ between sentences; a fixed offset per example and side
    # (through a pooled transform, whose output the features record) makes the head outputs vary, so the comparison is
    # not vacuous.
    spread = torch.randn(2, B, model.encoder.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def offsets():
        sides = iter(spread)  # the model transforms side 1, then side 2 (cross: the one sequence)
        return lambda e: e + next(sides)

    with torch.no_grad():
        para, sts = make_batch("para", pair_encoding), make_batch("sts", pair_encoding)
        model.set_pooled_transform("para", PooledFn(offsets()))
        model.set_pooled_transform("sts", PooledFn(offsets()))
        out_p = model("para", para)
        out_s = model("sts", sts)
        if pair_encoding == "siamese":
            e1, e2 = out_p.features["pooled_1"], out_p.features["pooled_2"]
            f1, f2 = _b1_features(model, "para", e1), _b1_features(model, "para", e2)
            want_para = _b1_mlp(model.para_head, torch.cat([f1 * f2, e1, e2], dim=-1)).squeeze(-1)
            u = _b1_features(model, "sts", out_s.features["pooled_1"])
            v = _b1_features(model, "sts", out_s.features["pooled_2"])
            want_sts = 5.0 * (u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1))
        else:
            want_para = _b1_mlp(model.para_head, _b1_features(model, "para", out_p.features["pooled"])).squeeze(-1)
            z = _b1_mlp(model.sts_head, _b1_features(model, "sts", out_s.features["pooled"])).squeeze(-1)
            want_sts = 5.0 * torch.sigmoid(z)
    assert want_para.std() > 1e-2 and want_sts.std() > 1e-2  # outputs vary over the batch
    torch.testing.assert_close(out_p.logits, want_para, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_s.logits, want_sts, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_task_losses_equal_hand_formulas(arch, pair_encoding):
    """task_loss: SST mean −log softmax(z)_y, paraphrase mean BCE with logits −[y log σ(z) + (1 − y) log(1 − σ(z))],
    STS mean squared error, each written out from the logits."""
    model = make_model(arch, pair_encoding).eval()
    with torch.no_grad():
        for task in TASKS:
            batch = make_batch(task, pair_encoding)
            out = model(task, batch)
            z, y = out.logits.double(), batch["labels"].double()
            if task == "sst":
                want = -(z.log_softmax(-1).gather(1, y.long()[:, None])).mean()
            elif task == "para":
                want = -(y * torch.sigmoid(z).log() + (1 - y) * (1 - torch.sigmoid(z)).log()).mean()
            else:
                want = ((z - y) ** 2).mean()
            got = model.task_loss(task, out, batch)
            assert got.item() == pytest.approx(want.item(), rel=1e-5), task


# ---- outputs keep float32 precision under bf16 autocast ------------------------------------------------------
# The encoder may run in bf16; the heads run in float32 (autocast off), so STS scores and the logits ensembles
# average are not rounded to bf16's 8 bits.


def _bf16_rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("arch", ["baseline", "b1"])
@pytest.mark.parametrize("pair_encoding", ["siamese", "cross"])
@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_logits_are_not_rounded_to_bf16(arch, pair_encoding, task):
    model = make_model(arch, pair_encoding=pair_encoding).eval()
    ds = make_dataset(task, n=23, mode=pair_encoding)
    out = predict_dataset(model, task, ds, autocast_dtype=torch.bfloat16).logits
    assert out.dtype == torch.float32
    # float32 values: bf16 can hold ~ 1 in 2^16 of them, so nearly every score differs from its bf16 rounding
    assert (out != _bf16_rounded(out)).float().mean() > 0.5, out


def test_sts_score_is_the_float32_head_on_the_bf16_encoder_output():
    model = make_model("b1", pair_encoding="cross").eval()
    ds = make_dataset("sts", n=8, mode="cross")
    batch = ds.collate(list(range(len(ds))))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model("sts", batch).logits
            e = model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        assert e.dtype == torch.bfloat16
        e = e.float()
        want = model.config.spans["sts"] * torch.sigmoid(model.sts_head(model._features("sts", e)).squeeze(-1))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


# ---- the mode helper -------------------------------------------------------------------------------------------


def test_preserved_modes_restores_every_submodule():
    """A model with a submodule in eval mode (LP-FT's frozen encoder) comes back with that submodule in eval,
    not with the top module's mode spread over all of them as ``model.train(was_training)`` would."""
    model = tiny_model()
    model.train()
    model.encoder.eval()
    before = {n: m.training for n, m in model.named_modules()}
    with preserved_modes(model):
        model.eval()
        assert not any(m.training for m in model.modules())
    assert {n: m.training for n, m in model.named_modules()} == before
    with pytest.raises(RuntimeError), preserved_modes(model):  # restored on an exception too
        model.train()
        raise RuntimeError
    assert {n: m.training for n, m in model.named_modules()} == before


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_the_new_kinds_get_heads_of_their_shape(arch, pair_encoding):
    """A pair classification of three classes scores C logits in every encoding (the baseline's Siamese:
    Sentence-BERT's classifier on (u, v, |u - v|), its own parameters); a sentence regression and a pair regression
    on a scale of their own give scores in it (low + span x sigmoid, or x cosine for a Siamese pair)."""
    three = Task("three", KINDS["pair-classification"], {}, Layout(("a", "b"), "y"), classes=("x", "y", "z"))
    rating = Task("rating", KINDS["sentence-regression"], {}, Layout(("t",), "y"), score_range=(1.0, 10.0))
    scale = Task("scale", KINDS["pair-regression"], {}, Layout(("a", "b"), "y"), score_range=(-2.0, 2.0))
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch=arch, pair_encoding=pair_encoding,
                                                                 fcn_size=16), TASKS + ("three", "rating", "scale"),
                          Tasks([three, rating, scale]))
    model.eval()
    ex = [Example(str(i), a, b, i % 3) for i, (a, b) in enumerate(PAIRS)]
    logits = model("three", PairDataset(ex, TOK, mode=pair_encoding, label_dtype=torch.long).collate(range(B))).logits
    assert logits.shape == (B, 3)
    assert hasattr(model, "three_classifier") == (arch == "baseline" and pair_encoding == "siamese")
    loss = model.task_loss("three", model("three", PairDataset(ex, TOK, mode=pair_encoding, label_dtype=torch.long)
                                          .collate(range(B))), {"labels": torch.tensor([e.label for e in ex])})
    assert loss.ndim == 0 and torch.isfinite(loss)
    scores = model("rating", SentenceDataset([Example(str(i), s) for i, s in enumerate(SENTENCES)], TOK)
                   .collate(range(B))).logits
    assert scores.shape == (B,) and bool(((scores >= 1) & (scores <= 10)).all())
    scaled = model("scale", PairDataset([Example(str(i), a, b) for i, (a, b) in enumerate(PAIRS)], TOK,
                                        mode=pair_encoding).collate(range(B))).logits
    low = -6.0 if pair_encoding == "siamese" else -2.0  # -2 + 4 cos: a cosine may be negative, as STS's
    assert bool(((scaled >= low) & (scaled <= 2.0)).all())


@pytest.mark.parametrize("arch,pair_encoding", GRID)
def test_a_declared_stream_goes_through_its_tasks_head_wherever_the_model_is_asked(arch, pair_encoding):
    """The model resolves a declared stream (SST's phrases) to the head of the task that declares it, in every
    method an objective calls, so that an objective passes the stream it trains on; NLI (no head) and a name no
    task has are refused naming the model's tasks."""
    model = make_model(arch, pair_encoding).eval()
    batch = make_batch("sst")
    assert model.head_task("phrases") == "sst" and model.sides("phrases") == model.sides("sst")
    assert model.feature_names("phrases") == model.feature_names("sst")
    out, same = model("phrases", batch), model("sst", batch)
    assert torch.equal(out.logits, same.logits)
    assert torch.equal(model.predict("phrases", out), model.predict("sst", same))
    assert torch.equal(model.task_loss("phrases", out, batch), model.task_loss("sst", same, batch))
    for name in ("nli", "mood"):
        with pytest.raises(ValueError, match=f"unknown task '{name}'; this model's tasks are "
                                             r"\['sst', 'para', 'sts'\]"):
            model(name, batch)
