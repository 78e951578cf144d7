"""Tests for tasks/prior.py: the pretrained encoder's cosine as a second opinion on STS (--sts-prior)."""

from __future__ import annotations

import json

import pytest
import sentence_transformers  # reference: a missing one fails instead of skipping
import torch

from minbert.pretrained import default_model_dir
from tasks.data import Example, PairDataset
from tasks.evaluate import predict_dataset
from tasks.prior import CosinePrior
from tests.helpers import WordTokenizer
from tests.test_model import make_model

PAIRS = [("A man is playing a guitar.", "A man plays the guitar."),
         ("Two dogs run on the grass.", "The stock market fell sharply today."),
         ("A woman is slicing an onion.", "Someone cuts an onion."),
         ("UN chief welcomes elections in Guinea", "UN chief condemns attack against peacekeepers in Mali")]


@pytest.fixture(scope="module")
def prior() -> CosinePrior:
    torch.set_num_threads(1)
    return CosinePrior(None, 0.5, "cpu")


def test_embeddings_equal_sentence_transformers_all_minilm(prior):
    """The prior embeds as sentence-transformers' all-MiniLM-L6-v2 does (mean pooling, unit length), in input
    order although batches are length-sorted."""
    reference = sentence_transformers.SentenceTransformer(str(default_model_dir()), device="cpu")
    texts = [t for pair in PAIRS for t in pair]
    want = torch.from_numpy(reference.encode(texts, normalize_embeddings=True))
    prior.batch_size = 3  # several length-sorted batches
    torch.testing.assert_close(prior.embed(texts), want, atol=2e-5, rtol=1e-4)


def test_blend_is_the_weighted_mean_with_five_times_the_cosine(prior):
    """blend = (1 - W) x scores + W x 5 x cos, per pair in dataset order; similar pairs score above unrelated."""
    ds = PairDataset([Example(f"x{i}", a, b, 1.0) for i, (a, b) in enumerate(PAIRS)], prior.tokenizer, mode="cross")
    a, b = prior.embed([p[0] for p in PAIRS]), prior.embed([p[1] for p in PAIRS])
    cos = (a * b).sum(-1)
    assert cos[0] > 0.8 and cos[2] > 0.6 and cos[1] < 0.2
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(prior.blend(ds, scores), 0.5 * scores + 2.5 * cos, atol=1e-5, rtol=1e-5)
    assert prior.cosines(ds) is prior.cosines(ds)  # computed once per dataset


def test_predict_dataset_blends_only_sts_scores(prior):
    """predict_dataset(sts_prior=...) returns the blended STS scores as logits and predictions; SST and
    paraphrase outputs never pass through it."""
    model = make_model("b1", "cross", pooling="mean").eval()  # tiny: its dataset uses the tiny tokenizer
    ds = PairDataset([Example(f"x{i}", a, b, float(i)) for i, (a, b) in enumerate(PAIRS)], WordTokenizer(),
                     mode="cross")
    calls = []

    def spy(dataset, scores):
        calls.append(dataset)
        return prior.blend(dataset, scores)

    plain = predict_dataset(model, "sts", ds)
    blended = predict_dataset(model, "sts", ds, sts_prior=spy)
    torch.testing.assert_close(blended.logits, prior.blend(ds, plain.logits))
    assert torch.equal(blended.preds, blended.logits) and calls == [ds]
    para = predict_dataset(model, "para", ds, sts_prior=spy)
    assert torch.equal(para.logits, predict_dataset(model, "para", ds).logits) and calls == [ds]


def test_weight_must_be_in_range():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        CosinePrior(None, 0.0, "cpu")


def test_building_the_prior_leaves_the_random_state_alone():
    """Loading the prior's encoder builds modules (whose init draws random numbers) before their weights are
    loaded: it must not move torch's global RNG, or the dropout masks after the first evaluation would depend on
    whether this process built it (a resumed run would differ from an uninterrupted one)."""
    torch.manual_seed(0)
    state = torch.get_rng_state()
    CosinePrior(None, 0.5, "cpu")
    assert torch.equal(torch.get_rng_state(), state)


def test_the_cache_keeps_only_the_latest_dataset(prior):
    """Cosines are cached for the dataset last scored (a run's dev set, scored every epoch), not for every
    dataset ever seen: a long-lived Predictor makes a new dataset per call and must not grow without bound."""
    sets = [PairDataset([Example(f"x{i}", a, b, 1.0) for i, (a, b) in enumerate(PAIRS[k:])], prior.tokenizer,
                        mode="cross") for k in range(3)]
    first = prior.cosines(sets[0])
    for ds in sets:
        prior.cosines(ds)
    assert len(prior._cache) == 1 and prior.cosines(sets[2]) is prior.cosines(sets[2])
    torch.testing.assert_close(prior.cosines(sets[0]), first)  # computed again, the same


def test_the_prior_is_the_sentence_encoder_whatever_pretrained_is(tmp_path):
    """--pretrained names the encoder to fine-tune (bert-base, an MLM checkpoint, a fine-tuned run), whose mean
    pooled cosine need not score similarity at all (a fine-tuned run's: r 0.54 on STS dev): the prior is the
    embedded all-MiniLM-L6-v2 unless --sts-prior-model names another sentence encoder."""
    from tasks.config import TrainConfig
    from tasks.prior import sts_prior_of
    from tests.test_train import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    fine_tuned_from_tiny = sts_prior_of(TrainConfig(pretrained=str(tiny)), "cpu", None)
    assert fine_tuned_from_tiny.encoder.config.hidden_size == 384  # all-MiniLM-L6-v2, not the tiny BERT
    chosen = sts_prior_of(TrainConfig(sts_prior_model=str(tiny)), "cpu", None)
    assert chosen.encoder.config.hidden_size == json.loads((tiny / "config.json").read_text())["hidden_size"] != 384
