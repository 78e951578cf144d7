"""Tests of tasks/objectives/knn_bert.py: the loss and the KNN vote by hand, the key model following the query
model's mode, and KNN-BERT trained end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tasks import train as cli
from tasks import selection as splits
from tasks.checkpoint import load_model, resolve_checkpoint
from tasks.predictions import read_predictions
from tasks.objectives import REGISTRY, build_objectives
from tasks.objectives.knn_bert import (
    KNNBert,
    KNNBertConfig,
    KNNClassifier,
    class_probabilities,
    compute_representations,
    supervised_moco_loss,
)
from tasks.objectives.rift import (
    RIFT,
    RIFTConfig,
)
from tasks.training.run import run
from tests.helpers import make_batch, tiny_model, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_knn_key_model_follows_the_query_models_mode_per_module():
    """With the query encoder frozen in eval (LP stage 1) and the heads in train mode, the key model encodes with
    its encoder in eval and its heads in train mode; in full training both are in train mode."""
    model = tiny_model()
    obj = KNNBert(KNNBertConfig(m_most=2, m_least=2), model)
    seen: dict[str, bool] = {}
    for n, m in obj.key_model.named_modules():
        m.register_forward_pre_hook(lambda module, args, n=n: seen.__setitem__(n, module.training))
    batch = make_batch("sst")
    for encoder_frozen in (True, False):
        model.train()
        if encoder_frozen:
            model.encoder.eval()
        seen.clear()
        obj(model, "sst", batch, model("sst", batch))
        want = dict(model.named_modules())
        assert seen and all(v == want[n].training for n, v in seen.items()), encoder_frozen
        assert seen["encoder"] is (not encoder_frozen)


class ToyDataset:
    """The dataset interface knn_predict uses (len, lengths, labels, collate) over one pre-built batch."""

    def __init__(self, task: str, pair_encoding: str, n: int, seed: int):
        self.batch = make_batch(task, pair_encoding, n=n, seed=seed)
        self.labels = self.batch["labels"]
        mask = self.batch.get("attention_mask", self.batch.get("attention_mask_1"))
        self.lengths = mask.sum(1).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def collate(self, indices) -> dict:
        idx = torch.tensor(list(indices))
        return {k: v[idx] for k, v in self.batch.items()}


def test_both_objectives_registered_and_built_by_name():
    """build_objectives finds "knn_bert" and "rift" by name; unknown options raise."""
    model = tiny_model()
    objs = build_objectives({"knn_bert": {"m_most": 3}, "rift": {"alpha": 0.5}}, model)
    assert isinstance(objs[0], KNNBert) and isinstance(objs[1], RIFT)
    assert REGISTRY["knn_bert"] is KNNBert and REGISTRY["rift"] is RIFT
    with pytest.raises(ValueError):
        build_objectives({"knn_bert": {"lambda_": 0.1}}, model)


def test_queue_is_fifo_with_labels_aligned():
    """Past capacity the oldest keys drop out first, and each label stays with its key (also for a batch > capacity)."""
    obj = KNNBert(KNNBertConfig(queue_size=5, tasks=("sst",)), tiny_model())
    ids = torch.arange(20, dtype=torch.float32)
    keys = ids[:, None].repeat(1, 4)  # key i is the constant vector i
    labels = (ids.long() * 7) % 5  # a label we can recompute from the key

    def check(expected_ids):
        k, y = obj.queue("sst")
        assert k[:, 0].tolist() == expected_ids
        assert torch.equal(y, (k[:, 0].long() * 7) % 5)

    obj.enqueue("sst", keys[:3], labels[:3])
    check([0, 1, 2])
    obj.enqueue("sst", keys[3:7], labels[3:7])  # 7 pushed, capacity 5: 0 and 1 drop out
    check([2, 3, 4, 5, 6])
    obj.enqueue("sst", keys[7:8], labels[7:8])
    check([3, 4, 5, 6, 7])
    obj.enqueue("sst", keys[8:15], labels[8:15])  # one batch larger than the queue: its newest 5 remain
    check([10, 11, 12, 13, 14])


def test_set_train_size_caps_the_queue():
    """The queue holds min(queue_size, train size) keys; resizing a non-empty queue raises."""
    obj = KNNBert(KNNBertConfig(queue_size=32000), tiny_model())
    obj.set_train_size(6, "sst")
    assert obj.capacity("sst") == 6 and obj.capacity("para") == 32000
    obj.enqueue("sst", torch.randn(10, 3), torch.zeros(10, dtype=torch.long))
    assert obj.queue("sst")[0].shape == (6, 3)
    with pytest.raises(ValueError, match="already holds"):
        obj.set_train_size(4, "sst")


def test_momentum_update_follows_eq5_exactly():
    """on_step_end sets θ_k ← m·θ_k + (1 − m)·θ_q for every key parameter and leaves the model untouched."""
    model = tiny_model()
    for m, exact in ((0.75, True), (0.999, False)):
        obj = KNNBert(KNNBertConfig(momentum=m), model)
        g = torch.Generator().manual_seed(1)
        before_k, before_q = {}, {}
        with torch.no_grad():
            for (name, pk), pq in zip(obj.key_model.named_parameters(), model.parameters()):
                # quarter-integers: with m = 0.75 the formula is exact in float32
                pk.copy_(torch.randint(-8, 9, pk.shape, generator=g).float() / 4)
                pq.copy_(torch.randint(-8, 9, pq.shape, generator=g).float() / 4)
                before_k[name], before_q[name] = pk.clone(), pq.clone()
        obj.on_step_end(model)
        for name, pk in obj.key_model.named_parameters():
            expected = m * before_k[name] + (1 - m) * before_q[name]
            if exact:
                assert torch.equal(pk, expected), name
            else:
                torch.testing.assert_close(pk, expected, rtol=1e-6, atol=1e-7)
        for name, pq in model.named_parameters():
            assert torch.equal(pq, before_q[name])


def test_key_model_gets_no_gradient_and_is_not_a_parameter():
    """The key model is outside objective.parameters(), gets no .grad from the loss, while the model does;
    its weights and the queues round-trip through state_dict."""
    model = tiny_model()
    obj = KNNBert(KNNBertConfig(m_most=2, m_least=1), model)
    assert list(obj.parameters()) == []
    assert all(not p.requires_grad for p in obj.key_model.parameters())
    model_ids = {id(p) for p in model.parameters()}
    assert not model_ids & {id(p) for p in obj.key_model.parameters()}

    batch = make_batch("sst")
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)
    assert set(terms) == {"sc"} and terms["sc"].requires_grad and torch.isfinite(terms["sc"])
    loss = obj.task_loss_scale * model.task_loss("sst", out, batch) + obj.term_weight("sc") * terms["sc"]
    loss.backward()
    assert all(p.grad is None for p in obj.key_model.parameters())
    assert float(model.encoder.embeddings.word_embeddings.weight.grad.abs().sum()) > 0

    sd = obj.state_dict()
    assert any(k.startswith("key_model.") for k in sd) and "sst_queue_keys" in sd
    fresh = KNNBert(KNNBertConfig(m_most=2, m_least=1), tiny_model(seed=5))
    fresh.load_state_dict(sd)
    for a, b in zip(fresh.queue("sst"), obj.queue("sst")):
        assert torch.equal(a, b)
    for (n, a), b in zip(fresh.key_model.named_parameters(), obj.key_model.parameters()):
        assert torch.equal(a, b), n


def test_to_carries_the_hidden_key_model_and_frozen_encoder():
    """objective.to(...) converts the modules kept out of .parameters() too (key model, frozen encoder)."""
    model = tiny_model()
    knn, rift = KNNBert(KNNBertConfig(), model), RIFT(RIFTConfig(), model)
    knn.to(torch.float64)
    rift.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in knn.key_model.parameters())
    assert all(p.dtype == torch.float64 for p in rift.frozen_encoder.parameters())
    assert all(p.dtype == torch.float64 for p in rift.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _eq3_by_loop(q, labels, keys, key_labels, m_most, m_least, tau):
    per_query = []
    for i in range(q.shape[0]):
        sims = [float(q[i] @ keys[j]) / tau for j in range(keys.shape[0])]
        pos = [j for j in range(keys.shape[0]) if key_labels[j] == labels[i]]
        neg = [j for j in range(keys.shape[0]) if key_labels[j] != labels[i]]
        if not pos:
            continue
        pos.sort(key=lambda j: -sims[j])
        chosen = pos if len(pos) <= m_most + m_least else pos[:m_most] + pos[len(pos) - m_least:]
        terms = []
        for j in chosen:
            denom = math.exp(sims[j]) + sum(math.exp(sims[n]) for n in neg)
            terms.append(-math.log(math.exp(sims[j]) / denom))
        per_query.append(sum(terms) / len(terms))
    return sum(per_query) / len(per_query)


def test_supervised_moco_loss_equals_eq3_loop():
    """supervised_moco_loss equals a direct loop over eq. 3 (M_m most + M_l least similar positives, all
    other-class keys as negatives; fewer positives: all of them; no positive: query left out)."""
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(4, 6, generator=g), dim=-1)
    keys = F.normalize(torch.randn(12, 6, generator=g), dim=-1)
    key_labels = torch.tensor([0] * 6 + [1] * 2 + [3] * 4)
    labels = torch.tensor([0, 1, 2, 0])  # 6 positives (> 3), 2 positives (<= 3), none, 6
    loss = supervised_moco_loss(q, labels, keys, key_labels, m_most=2, m_least=1, temperature=0.07)
    expected = _eq3_by_loop(q, labels, keys, key_labels, 2, 1, 0.07)
    assert loss.item() == pytest.approx(expected, rel=1e-5)

    # No negatives at all: each term is −log 1 = 0, with finite gradients.
    qg = q.clone().requires_grad_(True)
    zero = supervised_moco_loss(qg, torch.zeros(4, dtype=torch.long), keys, torch.zeros(12, dtype=torch.long),
                                2, 1, 0.07)
    zero.backward()
    assert zero.item() == pytest.approx(0.0, abs=1e-6) and torch.isfinite(qg.grad).all()
    # No positive anywhere (a class the queue has not seen): 0, graph intact.
    none = supervised_moco_loss(qg, torch.full((4,), 9), keys, key_labels, 2, 1, 0.07)
    none.backward()
    assert none.item() == 0.0 and torch.isfinite(qg.grad).all()


def test_knn_vote_is_exact_on_hand_built_neighbours():
    """KNN(q) is the unweighted label distribution of the K cosine-nearest stored examples (scale-invariant)."""
    feats = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.25], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 1, 2])
    query = torch.tensor([[1.0, 0.05], [-1.0, 0.1]])
    knn3 = KNNClassifier(k=3, num_classes=3).fit(feats * 10.0, labels)
    # query 0: nearest [1, 0], [0.9, 0.1], [0.8, 0.25] -> labels 0, 0, 1
    # query 1: nearest [-1, 0], [0, 1], [0.8, 0.25] -> labels 2, 1, 1
    torch.testing.assert_close(knn3.vote(query), torch.tensor([[2 / 3, 1 / 3, 0.0], [0.0, 2 / 3, 1 / 3]]))
    knn4 = KNNClassifier(k=4, num_classes=3).fit(feats, labels)
    assert torch.equal(knn4.vote(query[:1]), torch.tensor([[0.5, 0.5, 0.0]]))
    with pytest.raises(ValueError, match="only 5 stored"):
        KNNClassifier(k=6, num_classes=3).fit(feats, labels)


def knn_predict(model, task, train_dataset, eval_dataset, k=100, phi=0.25, batch_size=64,
                representation="pooled") -> torch.Tensor:
    """Eq. 1 for ``eval_dataset`` from its parts, the reference the final KNN inference is checked against:
    (1 − φ)·softmax(F(q)) + φ·KNN(q) over the labeled ``train_dataset``'s representations."""
    train_feats, _ = compute_representations(model, task, train_dataset, representation, batch_size)
    feats, logits = compute_representations(model, task, eval_dataset, representation, batch_size)
    knn = KNNClassifier(k, {"sst": 5, "para": 2}[task]).fit(train_feats, train_dataset.labels)
    return knn.predict_proba(feats, class_probabilities(model.entry(task), logits), phi)


@pytest.mark.parametrize("task", ["sst", "para"])
def test_phi_zero_is_the_linear_classifier_and_phi_mixes_eq1(task):
    """knn_predict: φ = 0 gives softmax(F(q)) (same predictions as the head), φ = 1 the KNN vote, and
    φ in between (1 − φ)·softmax + φ·KNN (eq. 1); paraphrase is the 2-class [1 − σ, σ]."""
    model = tiny_model(init=0.5).eval()
    train, dev = ToyDataset(task, "cross", 12, seed=1), ToyDataset(task, "cross", 6, seed=2)
    linear = knn_predict(model, task, train, dev, k=3, phi=0.0, batch_size=4)
    logits = model(task, dev.collate(range(6))).logits
    torch.testing.assert_close(linear, class_probabilities(model.entry(task), logits))
    assert torch.equal(linear.argmax(-1), model.predict(task, model(task, dev.collate(range(6)))))
    knn_only = knn_predict(model, task, train, dev, k=3, phi=1.0, batch_size=4)
    assert torch.allclose(knn_only.sum(-1), torch.ones(6)) and set((knn_only * 3).round().unique().tolist()) <= {
        0.0, 1.0, 2.0, 3.0}
    mixed = knn_predict(model, task, train, dev, k=3, phi=0.25, batch_size=5)
    torch.testing.assert_close(mixed, 0.75 * linear + 0.25 * knn_only)


@pytest.mark.parametrize("task,arch,pair_encoding,representation", [
    ("sst", "baseline", "cross", "pooled"),
    ("sst", "b1", "siamese", "head_input"),
    ("para", "baseline", "cross", "pooled"),
    ("para", "b1", "siamese", "head_input"),
])
def test_knn_bert_trains_end_to_end(task, arch, pair_encoding, representation):
    """Two training steps on a tiny MultitaskBert: L'_sc equals eq. 3 by loop over the queue (which holds this
    batch's keys) with the normalized representations as queries, gradient into the encoder, the queue grows,
    and the key model moves towards the model."""
    model = tiny_model(arch, pair_encoding).train()
    obj = KNNBert(KNNBertConfig(m_most=2, m_least=2, representation=representation, momentum=0.5), model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(2):
        batch = make_batch(task, pair_encoding, seed=step)
        opt.zero_grad()
        out = model(task, batch)
        sc = obj(model, task, batch, out)["sc"]
        keys, key_labels = obj.queue(task)
        q = F.normalize(out.features[representation].detach(), dim=-1)
        expected = _eq3_by_loop(q, batch["labels"].long(), keys, key_labels, 2, 2, obj.config.temperature)
        assert expected > 0 and sc.item() == pytest.approx(expected, rel=1e-4)
        (obj.task_loss_scale * model.task_loss(task, out, batch) + obj.term_weight("sc") * sc).backward()
        assert float(model.encoder.embeddings.word_embeddings.weight.grad.abs().sum()) > 0
        opt.step()
        obj.on_step_end(model)
        assert obj.queue(task)[0].shape[0] == 8 * (step + 1)
    gap = sum(float((k - q.detach()).abs().sum()) for k, q in zip(obj.key_model.parameters(), model.parameters()))
    assert gap > 0  # m = 0.5 after two updates: between the initial and the current weights


def test_knn_bert_refuses_siamese_baseline_paraphrase():
    """The Siamese baseline has no single pair representation: building knn_bert for para raises, sst-only works."""
    model = tiny_model("baseline", "siamese")
    with pytest.raises(ValueError, match="para"):
        KNNBert(KNNBertConfig(), model)
    with pytest.raises(ValueError, match="siamese"):
        KNNBert(KNNBertConfig(tasks=("para",), representation="pooled"), tiny_model("b1", "siamese"))
    KNNBert(KNNBertConfig(tasks=("sst",)), model)


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_knn_inference_metrics_and_leaderboard(tiny_env, tmp_path):
    """The final record has KNN-BERT dev metrics (at φ and φ = 1); φ = 0 equals the plain classifier; with φ > 0
    (set by --eval-only --knn-bert-knn-phi) the leaderboard files hold the eq. 1 prediction (knn_predict above)."""
    knn = {"m_most": 2, "m_least": 2, "queue_size": 20, "knn_k": 5, "knn_phi": 0.0}
    final = run(_cfg(tiny_env, tmp_path / "run", objectives={"knn_bert": knn}))
    assert final["knn"]["dev"] == final["dev"] and final["knn"]["leaderboard"] == "classifier"
    assert {"sst_acc", "para_acc", "sts_r", "overall"} == set(final["knn"]["dev_knn_only"])
    assert final["knn"]["dev_knn_only"]["sts_r"] == final["dev"]["sts_r"]
    assert _records(tmp_path / "run")[-1]["knn"] == final["knn"]

    best = tmp_path / "run" / "checkpoints" / "best"
    result = cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(tmp_path / "eval"),
                       "--knn-bert-knn-phi", "0.5"])
    assert result["knn"]["phi"] == 0.5 and result["knn"]["leaderboard"] == "knn"
    model, objectives, tokenizer, cfg = load_model(resolve_checkpoint(best))
    obj = objectives[0]
    obj.config = type(obj.config)(**{**knn, "knn_phi": 0.5})
    for task in ("sst", "para"):
        train = splits.make_dataset(task, splits.load_examples(task, "train", cfg), tokenizer, cfg)
        dev = splits.make_dataset(task, splits.load_examples(task, "dev", cfg), tokenizer, cfg)
        c = obj.config
        want = knn_predict(model, task, train, dev, k=c.knn_k, phi=c.knn_phi, representation=c.representation)
        want = want.argmax(-1)
        ids, written = read_predictions(tmp_path / "eval" / "predictions" / f"{task}-dev-output.csv")
        assert ids == dev.ids and torch.equal(written, want), task
        metric = {"sst": "sst_acc", "para": "para_acc"}[task]
        assert result["knn"]["dev"][metric] == pytest.approx((want == dev.labels.long()).double().mean().item())
