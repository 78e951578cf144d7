"""Tests of tasks/evaluation/priors.py: a frozen sentence encoder as a second opinion a task declares: STS's cosine
(--sts-prior), SST's probe (--sst-prior), a user's task's."""

from __future__ import annotations

import json

import pytest
import sentence_transformers  # reference: a missing one fails instead of skipping
import sklearn.linear_model  # reference for the SST probe: a missing one fails instead of skipping
import torch

from minbert.pretrained import default_model_dir
from tasks.data.datasets import PairDataset, SentenceDataset
from tasks.data.readers import Example
from tasks.evaluation.evaluator import predict_dataset
from tasks.checkpoint import prior_file
from tasks.storage import save_tensors
from tasks.evaluation.priors import CosinePrior, ProbePrior, fit_logistic_regression, prior_of
from tests.helpers import WordTokenizer, make_model

PAIRS = [("A man is playing a guitar.", "A man plays the guitar."),
         ("Two dogs run on the grass.", "The stock market fell sharply today."),
         ("A woman is slicing an onion.", "Someone cuts an onion."),
         ("UN chief welcomes elections in Guinea", "UN chief condemns attack against peacekeepers in Mali")]


def _prior(task: str, cfg, **kw):
    """``task``'s prior in the run of ``cfg`` (its RunTasks) on the CPU in fp32."""
    return prior_of(task, cfg, cfg.resolve(), "cpu", None, **kw)


@pytest.fixture(scope="module")
def prior() -> CosinePrior:
    torch.set_num_threads(1)
    return CosinePrior("sts", None, 0.5, "cpu")


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
    """predict_dataset(prior=...) returns the blended STS scores as logits and predictions; without a prior the
    outputs are the head's."""
    model = make_model("b1", "cross", pooling="mean").eval()  # tiny: its dataset uses the tiny tokenizer
    ds = PairDataset([Example(f"x{i}", a, b, float(i)) for i, (a, b) in enumerate(PAIRS)], WordTokenizer(),
                     mode="cross")
    calls = []

    def spy(dataset, scores):
        calls.append(dataset)
        return prior.blend(dataset, scores)

    plain = predict_dataset(model, "sts", ds)
    blended = predict_dataset(model, "sts", ds, prior=spy)
    torch.testing.assert_close(blended.logits, prior.blend(ds, plain.logits))
    assert torch.equal(blended.preds, blended.logits) and calls == [ds]
    assert not torch.equal(plain.logits, blended.logits)


def test_weight_must_be_in_range():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        CosinePrior("sts", None, 0.0, "cpu")


def test_building_the_prior_leaves_the_random_state_alone():
    """Loading the prior's encoder builds modules (whose init draws random numbers) before their weights are
    loaded: it must not move torch's global RNG, or the dropout masks after the first evaluation would depend on
    whether this process built it (a resumed run would differ from an uninterrupted one)."""
    import tasks.evaluation.priors as priors_module

    priors_module._LOADED.clear()  # build it, not the copy an earlier test loaded
    torch.manual_seed(0)
    state = torch.get_rng_state()
    CosinePrior("sts", None, 0.5, "cpu")
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


def test_a_new_dataset_of_the_same_sentences_is_not_encoded_again(prior, monkeypatch):
    """A run's final predictions make new dev datasets of the sentences its last evaluation scored; the cache is
    keyed by the sentences, so the frozen encoder does not encode them a second time."""
    pairs = [Example(f"x{i}", a, b, 1.0) for i, (a, b) in enumerate(PAIRS)]
    first = prior.cosines(PairDataset(pairs, prior.tokenizer, mode="cross"))
    monkeypatch.setattr(prior, "embed", lambda texts: pytest.fail("encoded again"))
    assert prior.cosines(PairDataset(pairs, prior.tokenizer, mode="cross")) is first


def test_the_prior_is_the_sentence_encoder_whatever_pretrained_is(tmp_path):
    """--pretrained names the encoder to fine-tune (bert-base, an MLM checkpoint, a fine-tuned run), whose mean
    pooled cosine need not score similarity at all (a fine-tuned run's: r 0.54 on STS dev): the prior is the
    embedded all-MiniLM-L6-v2 unless --sts-prior-model names another sentence encoder."""
    from tasks.train_config import TrainConfig
    from tests.helpers import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    fine_tuned_from_tiny = _prior("sts", TrainConfig(pretrained=str(tiny)))
    assert fine_tuned_from_tiny.encoder.config.hidden_size == 384  # all-MiniLM-L6-v2, not the tiny BERT
    chosen = _prior("sts", TrainConfig(prior_models={"sts": str(tiny)}))
    assert chosen.encoder.config.hidden_size == json.loads((tiny / "config.json").read_text())["hidden_size"] != 384


# ---- the SST prior -----------------------------------------------------------------------------------------------

SENTENCES = [("A gorgeous, witty, seductive movie.", 4), ("An utterly charming and hilarious film.", 4),
             ("It's a pleasant enough diversion.", 3), ("Solid, if unspectacular, entertainment.", 3),
             ("The film is neither good nor bad.", 2), ("It runs two hours.", 2),
             ("A tedious, forgettable exercise.", 1), ("The plot makes little sense.", 1),
             ("The worst movie of the year.", 0), ("A dreadful, unwatchable mess.", 0)]


@pytest.fixture(scope="module")
def sst_prior() -> ProbePrior:
    torch.set_num_threads(1)
    return ProbePrior("sst", None, 0.5, "cpu", train=([t for t, _ in SENTENCES], [y for _, y in SENTENCES]))


def test_logistic_regression_equals_scikit_learn():
    """The probe minimizes scikit-learn's multinomial objective (C x summed cross-entropy + ||W||^2 / 2, bias
    free): same class probabilities as sklearn's LogisticRegression with the same C."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 12, generator=g)
    y = (x[:, :5] + 0.8 * torch.randn(400, 5, generator=g)).argmax(-1)
    for c in (0.2, 5.0):
        ours = fit_logistic_regression(x, y, 5, c=c)
        reference = sklearn.linear_model.LogisticRegression(C=c, max_iter=5000, tol=1e-10).fit(x.numpy(), y.numpy())
        want = torch.from_numpy(reference.predict_proba(x.numpy())).float()
        torch.testing.assert_close((x @ ours["weight"].T + ours["bias"]).softmax(-1), want, atol=2e-4, rtol=0)


def test_weighted_logistic_regression_equals_scikit_learns_sample_weight():
    """Sample weights (the SST phrases' weight in experiments/sst_prior_phrases.py) act as scikit-learn's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 8, generator=g)
    y = (x[:, :5] + torch.randn(300, 5, generator=g)).argmax(-1)
    w = torch.rand(300, generator=g) * 2
    ours = fit_logistic_regression(x, y, 5, c=0.3, sample_weight=w)
    reference = sklearn.linear_model.LogisticRegression(C=0.3, max_iter=5000, tol=1e-10).fit(
        x.numpy(), y.numpy(), sample_weight=w.numpy())
    want = torch.from_numpy(reference.predict_proba(x.numpy())).float()
    torch.testing.assert_close((x @ ours["weight"].T + ours["bias"]).softmax(-1), want, atol=2e-4, rtol=0)


def test_sst_blend_is_the_log_of_the_mixed_probabilities(sst_prior):
    """blend = log((1 - W) softmax(logits) + W p_probe): its softmax is the mixture, rows sum to 1; the probe
    fitted on ten sentences puts a new positive sentence above a new negative one."""
    texts = ["A charming, witty delight.", "An unwatchable, tedious mess.", "It is a film."]
    ds = SentenceDataset([Example(f"s{i}", t, None, 0) for i, t in enumerate(texts)], sst_prior.tokenizer)
    probe = sst_prior.probabilities(ds)
    assert probe.shape == (3, 5) and probe[0, 3:].sum() > probe[1, 3:].sum()
    logits = torch.tensor([[3.0, 0, 0, 0, 0], [0, 0, 0, 0, 3.0], [0.0, 0, 0, 0, 0]])
    blended = sst_prior.blend(ds, logits)
    torch.testing.assert_close(blended.exp(), 0.5 * logits.softmax(-1) + 0.5 * probe)
    torch.testing.assert_close(blended.exp().sum(-1), torch.ones(3))
    assert sst_prior.probabilities(ds) is probe  # computed once per dataset


def test_predict_dataset_blends_only_sst_logits(sst_prior):
    """predict_dataset(prior=...) returns the blended SST logits and their argmax as predictions."""
    model = make_model("b1", "cross", pooling="mean").eval()
    sentences = SentenceDataset([Example(f"s{i}", t, None, y) for i, (t, y) in enumerate(SENTENCES)],
                                WordTokenizer())
    sentences.texts = [t for t, _ in SENTENCES]
    plain = predict_dataset(model, "sst", sentences)
    blended = predict_dataset(model, "sst", sentences, prior=sst_prior)
    torch.testing.assert_close(blended.logits, sst_prior.blend(sentences, plain.logits))
    assert torch.equal(blended.preds, blended.logits.argmax(-1))
    reversed_ = predict_dataset(model, "sst", sentences, prior=lambda ds, logits: -logits)  # preds follow
    assert torch.equal(reversed_.preds, (-plain.logits).argmax(-1)) and not torch.equal(reversed_.preds, plain.preds)


def test_a_saved_probe_predicts_without_the_training_data(sst_prior, tmp_path):
    """A checkpoint's sst_prior.safetensors is SST's probe: read back, it blends exactly as the fitted one, with
    no SST training file anywhere. Without it and without the data, the error names the data and --sst-prior 0."""
    from tasks.train_config import TrainConfig

    assert prior_file("sst") == "sst_prior.safetensors"
    save_tensors(tmp_path / prior_file("sst"), sst_prior.state_dict())
    cfg = TrainConfig(data_dir=str(tmp_path / "no-data"))
    loaded = _prior("sst", cfg, checkpoint=tmp_path)
    for key in ("weight", "bias"):
        assert torch.equal(loaded.state_dict()[key], sst_prior.state_dict()[key])
    (tmp_path / prior_file("sst")).unlink()
    with pytest.raises(FileNotFoundError, match=r"no training file at .*no-data.*--sst-prior 0"):
        _prior("sst", cfg, checkpoint=tmp_path)
    assert _prior("sst", TrainConfig(prior_weights={"sst": 0.0, "sts": 0.5})) is None
    assert _prior("sst", TrainConfig(tasks=["para", "sts"])) is None


def test_a_probe_of_the_wrong_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"weight \(5, 384\)"):
        ProbePrior("sst", None, 0.5, "cpu", state={"weight": torch.zeros(5, 8), "bias": torch.zeros(5)})
    with pytest.raises(ValueError, match="exactly one"):
        ProbePrior("sst", None, 0.5, "cpu")


@pytest.mark.parametrize("task", ["sts", "sst"])
def test_a_saved_runs_prior_encoder_that_is_gone_is_named_with_the_fix(task, tmp_path):
    """A run or an evaluation whose prior encoder is not there is refused before any work (``check_prior_models``,
    which prepare_run and prepare_eval call), naming the flag that fixes it."""
    from tasks.train_config import TrainConfig
    from tasks.evaluation.priors import check_prior_models

    cfg = TrainConfig(prior_models={task: str(tmp_path / "gone")})
    with pytest.raises(FileNotFoundError, match=rf"--{task}-prior-model .*gone: no such checkpoint directory .*"
                                                rf"name another, or pass --{task}-prior 0"):
        check_prior_models(cfg, cfg.resolve())
    off = TrainConfig(prior_models={task: str(tmp_path / "gone")}, prior_weights={"sst": 0.0, "sts": 0.0})
    check_prior_models(off, off.resolve())
    (tmp_path / "empty").mkdir()  # a directory, but no encoder's (and "", which is the working directory)
    for where in (str(tmp_path / "empty"), ""):
        cfg = TrainConfig(prior_models={task: where})
        with pytest.raises(FileNotFoundError, match=rf"--{task}-prior-model {where}: .* holds no sentence encoder "
                                                    rf"\(config\.json, weights, vocab\.txt\): name another, or "
                                                    rf"pass --{task}-prior 0"):
            check_prior_models(cfg, cfg.resolve())


def test_the_sts_and_sst_priors_share_one_encoder(sst_prior):
    """Both priors of a run are the embedded MiniLM by default: one copy in memory, loaded once."""
    from tasks.train_config import TrainConfig

    sts = _prior("sts", TrainConfig())
    assert sts.encoder is sst_prior.encoder and sts.tokenizer is sst_prior.tokenizer
    assert not any(p.requires_grad for p in sts.encoder.parameters()) and not sts.encoder.training
