"""Tests of tasks/checkpoint.py: a checkpoint is safetensors and JSON only, written atomically, and loads
in the reference libraries as it is.

checkpoints/best/encoder is a plain HF BERT directory and a sentence-transformers
model whose outputs equal ours (fp32, atol 1e-5); the checkpoint's top level is
refused by transformers' Auto classes instead of becoming a random BERT; and
``--pretrained`` pointed at a checkpoint continues from its fine-tuned encoder.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import sentence_transformers
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

from minbert.pretrained import load_pretrained
from tasks.train_config import TrainConfig
from tasks.checkpoint import check_encoder, load_model, resolve_checkpoint
from tasks.evaluation.evaluator import evaluate_checkpoint
from tasks.model import ModelConfig, MultitaskBert
from tasks.checkpoint import save_encoder_files
from tasks.storage import read_json
from tasks.training.run import run, trainer_for
from tests.helpers import snapshot, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- what a checkpoint holds, and how it is written --------------------------------------------------------


def test_checkpoint_files_are_safetensors_and_json_only(tiny_env, tmp_path, monkeypatch):
    """A checkpoint holds only safetensors and JSON (plus the vocabulary); nothing is pickled or torch.loaded."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    trainer_for(cfg).fit()
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
    trainer_for(cfg, resume_from=ckpt)  # loads model, optimizer, state without torch.load
    evaluate_checkpoint(ckpt, out_dir=tmp_path / "eval")


# ---- the encoder a run or an evaluation builds its model on ------------------------------------------------


def test_check_encoder_reads_the_checkpoints_encoder_before_pretrained(tiny_env, tmp_path):
    """check_encoder measures --max-length and --reinit-layers against the checkpoint's encoder/config.json when
    the checkpoint has one, else against --pretrained's; an evaluation never reads --pretrained's weights."""
    pretrained = tmp_path / "pretrained"
    shutil.copytree(tiny_env[0], pretrained)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pretrained, ckpt / "encoder")
    config = read_json(ckpt / "encoder" / "config.json")
    positions, layers = config["max_position_embeddings"], config["num_hidden_layers"]
    (ckpt / "encoder" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions // 2,
                                                             "num_hidden_layers": layers - 1}))
    longer = tiny_train_config(tiny_env, tmp_path / "run", pretrained=str(pretrained), max_length=positions)
    check_encoder(longer)  # --pretrained's positions
    with pytest.raises(ValueError, match=f"--max-length {positions} is more than the {positions // 2} positions "
                                         f"of the encoder in {ckpt / 'encoder'}"):
        check_encoder(longer, ckpt, eval_only=True)
    deeper = tiny_train_config(tiny_env, tmp_path / "run", pretrained=str(pretrained), reinit_layers=layers)
    check_encoder(deeper)
    with pytest.raises(ValueError, match=f"--reinit-layers {layers}: the encoder in {ckpt / 'encoder'} has "
                                         f"{layers - 1} layers"):
        check_encoder(deeper, ckpt)
    weights = pretrained / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    check_encoder(longer, ckpt / "missing", eval_only=True)  # --pretrained's config only: its weights unread
    with pytest.raises(ValueError, match=r"--pretrained .*pretrained: .*truncated or corrupted"):
        check_encoder(longer)


# ---- the checkpoint in transformers and sentence-transformers ---------------------------------------------


SENTENCES = ["the movie was great .", "a dull and boring film", "how do i learn python fast ?"]


@pytest.fixture(scope="module")
def trained(tiny_env, tmp_path_factory) -> Path:
    """A finished tiny run (Siamese b1, mean pooling): its checkpoints/best."""
    out = tmp_path_factory.mktemp("interop") / "run"
    run(tiny_train_config(tiny_env, out, epochs=1,
                          model=ModelConfig(arch="b1", pair_encoding="siamese", pooling="mean", fcn_size=16)))
    return out / "checkpoints" / "best"


def _ours(model: MultitaskBert, tokenizer, sentences: list[str]) -> tuple[dict, torch.Tensor]:
    batch = tokenizer(sentences, max_length=32)
    with torch.no_grad():
        out = model.encoder(**batch)
        return out, model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def test_encoder_dir_loads_in_transformers_and_sentence_transformers(trained):
    model, _, tokenizer, cfg = load_model(resolve_checkpoint(trained))
    model.eval()
    enc = trained / "encoder"
    hf, info = transformers.AutoModel.from_pretrained(enc, output_loading_info=True)
    assert type(hf).__name__ == "BertModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf.eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(enc)
    ours, emb = _ours(model, tokenizer, SENTENCES)
    theirs = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(theirs["input_ids"], tokenizer(SENTENCES, max_length=32)["input_ids"])
    with torch.no_grad():
        ref = hf(**theirs)
    torch.testing.assert_close(ref.last_hidden_state, ours["last_hidden_state"], atol=1e-5, rtol=0)
    torch.testing.assert_close(ref.pooler_output, ours["pooler_output"], atol=1e-5, rtol=0)

    st = sentence_transformers.SentenceTransformer(str(enc), device="cpu")
    assert st.max_seq_length == cfg.max_length
    got = st.encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(got, emb, atol=1e-5, rtol=0)  # mean pooling: what the heads read


def test_predictor_says_its_precision_and_in_fp32_equals_sentence_transformers(trained, caplog):
    """The Predictor logs the precision it runs in (bf16 on a bf16 CPU is ~6e-3 from sentence-transformers), and
    bf16=False (--no-bf16) gives fp32, equal to sentence-transformers within the README's 1e-5."""
    from tasks.evaluation.evaluator import Predictor

    caplog.set_level(logging.INFO)
    fp32 = Predictor.from_checkpoint(trained, device="cpu", bf16=False)
    assert f"predicting with {trained} on cpu, fp32 (--no-bf16)" in caplog.text
    st = sentence_transformers.SentenceTransformer(str(trained / "encoder"), device="cpu")
    torch.testing.assert_close(fp32.embed(SENTENCES), st.encode(SENTENCES, convert_to_tensor=True), atol=1e-5, rtol=0)
    Predictor.from_checkpoint(trained, device="cpu", bf16=True)
    assert f"predicting with {trained} on cpu, bf16 autocast (--bf16)" in caplog.text


@pytest.mark.parametrize("pooling", ["cls", "pooler"])
def test_sentence_transformers_pooling_follows_the_run(tiny_env, tmp_path, pooling):
    """cls: ST's embedding is ours; pooler: ST gives the raw [CLS] state, transformers' pooler_output ours."""
    encoder, tokenizer = load_pretrained(tiny_env[0])
    model = MultitaskBert(encoder, ModelConfig(pooling=pooling)).eval()
    save_encoder_files(tmp_path / "enc", encoder, tokenizer, max_length=32, pooling=pooling)
    out, emb = _ours(model, tokenizer, SENTENCES)
    got = sentence_transformers.SentenceTransformer(str(tmp_path / "enc"), device="cpu").encode(
        SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(got, out["last_hidden_state"][:, 0], atol=1e-5, rtol=0)
    if pooling == "cls":
        torch.testing.assert_close(got, emb, atol=1e-5, rtol=0)
    else:
        hf = transformers.AutoModel.from_pretrained(tmp_path / "enc").eval()
        with torch.no_grad():
            pooled = hf(**tokenizer(SENTENCES, max_length=32)).pooler_output
        torch.testing.assert_close(pooled, emb, atol=1e-5, rtol=0)


def test_top_level_checkpoint_is_never_a_random_model(trained, caplog):
    """AutoModel / SentenceTransformer refuse the top level; BertModel (explicit class) loads none of it, saying so."""
    for path in (trained, trained.parent.parent):  # checkpoints/best and the run directory
        with pytest.raises(ValueError, match="minbert-multitask"):
            transformers.AutoModel.from_pretrained(path)
        with pytest.raises(ValueError, match="minbert-multitask"):
            transformers.AutoConfig.from_pretrained(path)
        with pytest.raises(ValueError, match="minbert-multitask"):
            sentence_transformers.SentenceTransformer(str(path), device="cpu")
    transformers.logging.enable_propagation()
    with caplog.at_level(logging.WARNING):
        model, info = transformers.BertModel.from_pretrained(trained, output_loading_info=True)
    assert "minbert-multitask" in caplog.text  # "a model of type minbert-multitask to instantiate ... bert"
    assert set(info["missing_keys"]) == set(model.state_dict()) - {"embeddings.position_ids"}  # nothing loaded


def test_pretrained_checkpoint_continues_from_its_fine_tuned_encoder(trained):
    fine_tuned = load_model(resolve_checkpoint(trained))[0].encoder.state_dict()
    for path in (trained, trained.parent.parent):
        encoder, _ = load_pretrained(path)
        for k, v in encoder.state_dict().items():
            assert torch.equal(v, fine_tuned[k]), k


def test_best_does_not_share_files_with_last(tiny_env, tmp_path):
    """best is a copy of last, not links to its files: changing every file of last in place (a disk error, an
    editor) leaves best's bytes as they were."""
    run(tiny_train_config(tiny_env, tmp_path / "run", epochs=1))
    last, best = tmp_path / "run" / "checkpoints" / "last", tmp_path / "run" / "checkpoints" / "best"
    before = snapshot(best)
    assert before == snapshot(last)  # the one epoch is the best: the same checkpoint
    for f in last.rglob("*"):
        if f.is_file():
            with open(f, "r+b") as handle:  # in place: the same inode
                handle.write(b"\0" * 8)
    assert snapshot(best) == before


# ---- checkpoints of other formats ------------------------------------------------------------------------------


def test_an_older_formats_weights_load_through_the_upgrade_chain(trained, tmp_path, monkeypatch):
    """A checkpoint whose weights an earlier format named otherwise (planted: format 1 of a code at format 3 that
    renamed the heads twice) loads through each step of WEIGHT_UPGRADES in order, to the very weights, for
    evaluation and the Predictor; it is not resumed (its optimizer's names are the old ones); a format newer
    than the code's is refused in one line that says what to do."""
    from safetensors.torch import save_file

    from tasks import checkpoint

    old = tmp_path / "old"
    shutil.copytree(trained, old)
    weights = load_file(str(old / "model.safetensors"))
    save_file({k.replace("_head.", "_classifier."): v for k, v in weights.items()}, str(old / "model.safetensors"))
    steps = []

    def one_to_two(w):
        steps.append(1)
        return {k.replace("_classifier.", "_out."): v for k, v in w.items()}

    def two_to_three(w):
        steps.append(2)
        return {k.replace("_out.", "_head."): v for k, v in w.items()}
    monkeypatch.setattr(checkpoint, "CHECKPOINT_FORMAT", 3)
    monkeypatch.setattr(checkpoint, "WEIGHT_UPGRADES", {1: one_to_two, 2: two_to_three})
    model, *_ = load_model(old)
    assert steps == [1, 2] and any("_head." in k for k in weights)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="a checkpoint of format 1 \\(this code's: 3\\) cannot be resumed; "
                                         "--eval-only and predict load its weights"):
        checkpoint.resume_point(old)

    monkeypatch.setattr(checkpoint, "CHECKPOINT_FORMAT", 1)
    state = read_json(old / "state.json")
    (old / "state.json").write_text(json.dumps({**state, "format": 2}))
    with pytest.raises(ValueError, match="is a checkpoint of format 2, newer than this code reads \\(1\\): update "
                                         "the code"):
        load_model(old)


# ---- what a resume or an evaluation reads, and its refusals --------------------------------------------------------


def test_a_save_only_model_run_is_refused_for_resume_in_one_line_with_no_fallback(trained, tmp_path, caplog):
    """A run that kept its model alone (--save-only-model: no last, best without its optimizer state) cannot be
    resumed: resume_point says so in one line naming the run and what can be done, with no warning about resuming
    from best first; a model-only checkpoint named directly is refused alike."""
    from tasks.checkpoint import keep_model_only, resume_point

    run_dir = tmp_path / "run"
    shutil.copytree(trained.parent.parent, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "last")
    keep_model_only(run_dir / "checkpoints" / "best")
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as error:
        resume_point(run_dir / "checkpoints" / "last")
    assert str(error.value) == (f"{run_dir} kept its model alone (--save-only-model), so it cannot be resumed: "
                                f"evaluate it with --eval-only --out-dir {run_dir}, or train it again (another "
                                "--out-dir, or --overwrite)")
    assert not caplog.records
    with pytest.raises(ValueError, match=rf"^{run_dir} kept its model alone \(--save-only-model\), so it cannot be "):
        resume_point(run_dir / "checkpoints" / "best")


def test_a_bad_minbert_plugins_entry_is_not_blamed_on_the_checkpoints_config(trained, plugin_registry, tmp_path,
                                                                             monkeypatch):
    """Reading a checkpoint's config with a MINBERT_PLUGINS entry that is not there names MINBERT_PLUGINS, not the
    config.json that was being read."""
    from tasks.checkpoint import verify_checkpoint

    monkeypatch.setenv("MINBERT_PLUGINS", str(tmp_path / "nope.py"))
    with pytest.raises(ValueError) as error:
        verify_checkpoint(trained)
    assert str(error.value).startswith(f"MINBERT_PLUGINS names {tmp_path / 'nope.py'}: no such Python file")
