"""tasks/objectives/mnr.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss  # test dependency
from torch import nn

from minbert.bert import BertModel
from tasks.model import ModelConfig, MultitaskBert
from tasks.objectives import REGISTRY, build_objectives, objective_config
from tasks.objectives.mnr import MNRConfig, MultipleNegativesRanking, masked_mnr_loss, mnr_loss, sts_label_weights
from tasks.objectives.simcse import SimCSEConfig, simcse_loss
from tasks.objectives.smart import smart_divergence, smart_penalty
from tests.helpers import OBJECTIVE_B as B
from tests.helpers import siamese_batch as make_batch
from tests.helpers import siamese_model as tiny_model
from tests.helpers import sides_seq, tiny_config


def test_registry_contains_the_three_objectives():
    """Importing the modules registers "mnr", "simcse" and "smart"; build_objectives finds them by name."""
    for name in ("mnr", "simcse", "smart"):
        assert name in REGISTRY
    objs = build_objectives({"mnr": {}, "simcse": {}, "smart": {}}, None)
    assert [o.name for o in objs] == ["mnr", "simcse", "smart"]
    assert REGISTRY["mnr"].needs_siamese is True


def test_configs_refuse_contradictions():
    """Contradictory or unknown options raise with a reason instead of being ignored."""
    with pytest.raises(ValueError, match="para_positives"):
        MNRConfig(tasks=("sts", "para"))
    with pytest.raises(ValueError, match="para_positives"):
        MNRConfig(tasks=("sts",), para_positives=True)
    with pytest.raises(ValueError, match="objective 'mnr' supports pair-regression and pair-classification tasks, and task 'sst' is a sentence-classification"):
        objective_config("mnr", {"tasks": ["sst"]})
    with pytest.raises(ValueError):
        SimCSEConfig(similarity="l2")
    with pytest.raises(ValueError, match=r"objective 'smart' can take the streams sst, para, sts \(or a task of kind .*\), not nli"):
        objective_config("smart", {"tasks": ["nli"]})
    with pytest.raises(ValueError):
        build_objectives({"smart": {"radius": 1.0}}, None)


def test_mnr_default_tasks_follow_para_positives():
    """Empty tasks = ("sts", "nli"), plus "para" exactly when para_positives is set."""
    assert MultipleNegativesRanking(MNRConfig()).active_tasks() == ("sts", "nli")
    assert MultipleNegativesRanking(MNRConfig(para_positives=True)).active_tasks() == ("sts", "nli", "para")
    assert MultipleNegativesRanking(MNRConfig(tasks=("nli",))).active_tasks() == ("nli",)


@pytest.mark.parametrize("n_neg", [0, 1, 2])
def test_mnr_equals_sentence_transformers(n_neg):
    """mnr_loss equals sentence-transformers' MultipleNegativesRankingLoss (scale 20, cos_sim), hard negatives included."""
    g = torch.Generator().manual_seed(1)
    a, b, *negs = torch.randn(2 + n_neg, 8, 16, generator=g).unbind(0)
    ref = MultipleNegativesRankingLoss(nn.Identity(), scale=20.0).compute_loss_from_embeddings([a, b, *negs], None)
    ours = mnr_loss(a, b, negatives=negs or None, scale=20.0)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_mnr_weighted_is_plain_when_labels_are_equal():
    """Unit weights give the plain loss; equal labels l give it times e^l / Σ_{j=0..5} e^j (§4.4 equation)."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 8, 16, generator=g).unbind(0)
    plain = mnr_loss(a, b)
    torch.testing.assert_close(mnr_loss(a, b, weights=torch.ones(8)), plain)
    for label in (0.0, 3.0, 5.0):
        w = sts_label_weights(torch.full((8,), label))
        common = math.exp(label) / sum(math.exp(j) for j in range(6))
        torch.testing.assert_close(mnr_loss(a, b, weights=w), common * plain)


def test_mnr_weighted_matches_paper_equation():
    """The STS variant equals -1/K Σ_i w_i log softmax_i(20·cos) written as explicit loops."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 5, 4, generator=g).unbind(0)
    labels = torch.tensor([0.0, 1.5, 5.0, 3.2, 4.0])
    norm = sum(math.exp(j) for j in range(6))
    total = 0.0
    for i in range(5):
        s = [20.0 * F.cosine_similarity(a[i], b[j], dim=0).item() for j in range(5)]
        log_p = s[i] - math.log(sum(math.exp(x) for x in s))
        total += math.exp(labels[i].item()) / norm * log_p
    expected = -total / 5
    assert mnr_loss(a, b, weights=sts_label_weights(labels)).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("hard_negatives", [True, False])
def test_mnr_nli_uses_sts_head_and_hard_negative_column(hard_negatives):
    """NLI triplets go through the STS head's pair_embeddings; the stacked pass equals separate passes; _3 is a column iff enabled."""
    model = tiny_model().eval()
    batch = make_batch("nli")
    for key in ("input_ids_2", "attention_mask_2", "token_type_ids_2"):
        batch[key] = batch[key][:, :5]  # sides of different lengths: the stacked pass pads them
    obj = MultipleNegativesRanking(MNRConfig(hard_negatives=hard_negatives))
    got = obj(model, "nli", batch, None)["loss"]
    z = [model.pair_embeddings("sts", model.embed(batch["input_ids" + s], batch["attention_mask" + s],
                                          batch["token_type_ids" + s])) for s in ("_1", "_2", "_3")]
    expected = mnr_loss(z[0], z[1], negatives=z[2] if hard_negatives else None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_mnr_sts_uses_head_features_and_label_weights():
    """On STS, MNR reads out.features cos_1/cos_2 and weights by the batch labels (on by default)."""
    model = tiny_model().eval()
    batch = make_batch("sts")
    out = model("sts", batch)
    got = MultipleNegativesRanking(MNRConfig())(model, "sts", batch, out)["loss"]
    expected = mnr_loss(out.features["cos_1"], out.features["cos_2"], weights=sts_label_weights(batch["labels"]))
    torch.testing.assert_close(got, expected)
    plain = MultipleNegativesRanking(MNRConfig(sts_label_weighting=False))(model, "sts", batch, out)["loss"]
    torch.testing.assert_close(plain, mnr_loss(out.features["cos_1"], out.features["cos_2"]))


def test_mnr_para_positives_only_and_zero_below_two():
    """Para MNR ranks only the label-1 pairs on pooled embeddings (equal to mnr_loss of the indexed positives, the
    formula the mask replaced); fewer than 2 positives gives exactly 0 with a zero gradient."""
    model = tiny_model().eval()
    batch = make_batch("para")
    out = model("para", batch)
    obj = MultipleNegativesRanking(MNRConfig(para_positives=True))
    pos = batch["labels"] > 0.5
    expected = mnr_loss(out.features["pooled_1"][pos], out.features["pooled_2"][pos])
    torch.testing.assert_close(obj(model, "para", batch, out)["loss"], expected, rtol=1e-6, atol=1e-6)
    for labels in ([1., 0., 0., 0., 0., 0.], [0.] * 6):
        batch["labels"] = torch.tensor(labels)
        a = out.features["pooled_1"].detach().requires_grad_(True)
        loss = masked_mnr_loss(a, out.features["pooled_2"].detach(), batch["labels"] > 0.5)
        loss.backward()
        assert loss.item() == 0.0 and torch.count_nonzero(a.grad) == 0
        assert obj(model, "para", batch, out)["loss"].item() == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_masked_mnr_equals_mnr_of_the_kept_pairs(seed):
    """masked_mnr_loss(a, b, keep) = mnr_loss(a[keep], b[keep]) for random masks (2 or more kept pairs), value and
    gradient: the rewrite without boolean indexing computes the same numbers."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(2, 10, 8, generator=g).unbind(0)
    keep = torch.rand(10, generator=g) < 0.6
    keep[:2] = True
    a1, a2 = a.clone().requires_grad_(True), a.clone().requires_grad_(True)
    masked = masked_mnr_loss(a1, b, keep, scale=20.0)
    indexed = mnr_loss(a2[keep], b[keep], scale=20.0)
    torch.testing.assert_close(masked, indexed, rtol=1e-6, atol=1e-6)
    masked.backward()
    indexed.backward()
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-5, atol=1e-7)


def test_mnr_refuses_cross_encoded_pairs():
    """Without Siamese features (pair_encoding='cross') MNR raises instead of guessing."""
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="b1", fcn_size=16, pair_encoding="cross")).eval()
    g = torch.Generator().manual_seed(0)
    batch = {**sides_seq("", g), "labels": torch.rand(B) * 5}
    with pytest.raises(ValueError, match="Siamese"):
        MultipleNegativesRanking(MNRConfig())(model, "sts", batch, model("sts", batch))


CASES = [("mnr", {}, "sts"), ("mnr", {}, "nli"), ("mnr", {"para_positives": True}, "para"),
         ("simcse", {"tasks": ("sst", "para", "sts", "nli")}, "sst"), ("simcse", {}, "sts"),
         ("smart", {"epsilon": 1e-3}, "sst"), ("smart", {"epsilon": 1e-3}, "para"),
         ("smart", {"epsilon": 1e-3}, "sts")]


@pytest.mark.parametrize("name,overrides,task", CASES)
def test_objective_gradients_reach_the_encoder(name, overrides, task):
    """Each objective's term back-propagates into the encoder's layers and word embeddings."""
    model = tiny_model().train()
    batch = make_batch(task)
    obj = build_objectives({name: overrides}, model)[0]
    assert obj.applies_to(task)
    out = None if task == "nli" else model(task, batch)
    terms = obj(model, task, batch, out)
    assert terms
    sum(terms.values()).backward()
    for pname in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.qkv.weight"):
        grad = model.encoder.get_parameter(pname).grad
        assert grad is not None and grad.abs().sum() > 0, pname


def _expected_term(model, name: str, task: str, batch: dict, out, seed: int) -> torch.Tensor:
    """The term of objective ``name`` on ``batch`` computed from the model's passes, not through the objective
    (eval mode: no dropout, so every pass is the same function)."""
    def embed(s):
        return model.embed(batch["input_ids" + s], batch["attention_mask" + s], batch["token_type_ids" + s])

    if name == "mnr":
        if task == "sts":
            return mnr_loss(out.features["cos_1"], out.features["cos_2"], weights=sts_label_weights(batch["labels"]))
        if task == "nli":
            z = [model.pair_embeddings("sts", embed(s)) for s in ("_1", "_2", "_3")]
            return mnr_loss(z[0], z[1], negatives=z[2])
        pos = batch["labels"] > 0.5
        return mnr_loss(out.features["pooled_1"][pos], out.features["pooled_2"][pos])
    if name == "simcse":  # eval mode: the two views coincide
        sides = [s for s in ("", "_1", "_2", "_3") if "input_ids" + s in batch]
        return torch.stack([simcse_loss(embed(s), embed(s)) for s in sides]).mean()
    torch.manual_seed(seed)  # the objective drew δ_0 from this seed: the same δ
    _, delta = smart_penalty(model, task, batch, sigma=0.1, step_size=2.0, epsilon=1.0)
    sides = list(delta)
    e = {s: model.encoder.embed_tokens(batch["input_ids" + s]) for s in sides}
    adv = model(task, batch, inputs_embeds={s: e[s] + delta[s] for s in sides}).logits
    return smart_divergence(model.entry(task), adv, model(task, batch).logits)


@pytest.mark.parametrize("arch", ["baseline", "b1"])
def test_objectives_end_to_end_terms_equal_independent_computations(arch):
    """All three objectives on a tiny MultitaskBert, every task stream they apply to: each term equals the same
    quantity computed from the model's own passes (MNR and SimCSE from embeddings, SMART's l_s at the δ it drew),
    and the summed loss back-propagates."""
    model = tiny_model(arch).eval()
    with torch.no_grad():  # heads at init (std 0.02) give near-constant logits; spread them so l_s is not ~0
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and not name.startswith("encoder."):
                m.weight.normal_(0.0, m.in_features ** -0.5)
    smart = {"sigma": 0.1, "step_size": 2.0, "epsilon": 1.0}  # a penalty far above rounding
    objs = build_objectives({"mnr": {"para_positives": True}, "simcse": {"tasks": ("sst", "para", "sts", "nli")},
                             "smart": smart}, model)
    seen = set()
    for k, task in enumerate(("sst", "para", "sts", "nli")):
        batch = make_batch(task)
        out = None if task == "nli" else model(task, batch)
        total = model.task_loss(task, out, batch) if out is not None else 0.0
        for obj in objs:
            if obj.applies_to(task):
                seed = 100 + k
                torch.manual_seed(seed)
                terms = obj(model, task, batch, out)
                assert set(terms) == {"loss" if obj.name != "smart" else "penalty"}
                for value in terms.values():
                    expected = _expected_term(model, obj.name, task, batch, out, seed)
                    assert expected.item() > 1e-4, (obj.name, task)  # not 0 = 0
                    torch.testing.assert_close(value, expected, rtol=1e-4, atol=0.0, msg=f"{obj.name} {task}")
                    total = total + obj.term_weight(name) * value
                    seen.add((obj.name, task))
        total.backward()
    assert seen == {("mnr", "sts"), ("mnr", "nli"), ("mnr", "para"), ("simcse", "sst"), ("simcse", "para"),
                    ("simcse", "sts"), ("simcse", "nli"), ("smart", "sst"), ("smart", "para"), ("smart", "sts")}


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_smart_acts_under_bf16_autocast(task):
    """Under the default bf16 autocast SMART's δ of 1e-5 still changes the output (its passes run in fp32): the
    penalty is nonzero and equals the penalty computed with autocast off (same δ0, no dropout)."""
    model = tiny_model().eval()
    batch = make_batch(task)
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_bf16, _ = smart_penalty(model, task, batch)
    torch.manual_seed(3)
    fp32, _ = smart_penalty(model, task, batch)
    assert under_bf16.item() > 0
    torch.testing.assert_close(under_bf16, fp32, rtol=1e-4, atol=0)


def test_a_pair_classification_of_three_classes_is_refused_before_any_data(tmp_path, tiny_env):
    """MNR ranks the positive pairs of a two-class pair task; one of three classes has none: refused by the
    run's checks, naming the task, before anything is read."""
    from tasks.task import KINDS, Layout, Task
    from tests.helpers import tiny_train_config

    three = Task("three", KINDS["pair-classification"], {"train": "x.csv", "dev": "x.csv"}, Layout(("a", "b"), "y"),
                 classes=("a", "b", "c"))
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("sts", "three"), user_tasks=[three],
                            objectives={"mnr": {"tasks": ["sts", "three"], "para_positives": False}},
                            model={"pair_encoding": "siamese"})
    with pytest.raises(ValueError, match="mnr ranks a pair classification's positive pairs, which needs two classes, "
                                         "and task 'three' has 3"):
        cfg.validate()


def test_a_users_two_class_pair_task_takes_mnr_over_its_positive_pairs_as_para_does():
    """A user's two-class pair task (one logit, as Quora's) is configured for MNR as "para" is: with
    para_positives, its config is taken, by the objective's check and by a run's; without, the run's check refuses
    the contradiction, as for para."""
    from tasks.task import PAIR_BINARY, Layout, Task, Tasks
    from tasks.train_config import TrainConfig

    dup = Task("dup", PAIR_BINARY, {}, Layout(("a", "b"), "y"), classes=("0", "1"), symmetric=True)
    entries = Tasks([dup])
    _, config = objective_config("mnr", {"tasks": ["sts", "dup"], "para_positives": True}, entries)
    run = TrainConfig(tasks=("sst", "para", "sts", "dup"), user_tasks=[dup], model=ModelConfig(pair_encoding="siamese"))
    MultipleNegativesRanking.check_run(config, run)
    _, config = objective_config("mnr", {"tasks": ["sts", "dup"]}, entries)
    with pytest.raises(ValueError, match="para_positives must agree"):
        MultipleNegativesRanking.check_run(config, run)
