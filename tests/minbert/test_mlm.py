"""Tests of minbert/mlm.py: BERT's MLM head equals transformers' on the same weights, its loss counts the masked
positions only, its decoder is the word-embedding matrix."""

from __future__ import annotations

import copy
import logging

import torch
import transformers

from minbert.bert import BertModel
from minbert.mlm import IGNORE_INDEX, BertForMaskedLM, load_mlm, masked_positions, mlm_loss
from minbert.pretrained import read_state_dict
from minbert.tokenizer import BertTokenizer
from tasks.training.masking import mask_tokens
from tasks.training.pretraining import save_mlm_checkpoint
from tests.helpers import hf_config_dict, mlm_batch, tiny_config, write_hf_checkpoint, write_vocab_dir

PAD, UNK, CLS, SEP, MASK = range(5)
META = torch.device("meta")


def test_loss_counts_masked_positions_only():
    """Changing the logits at unmasked positions (label -100) leaves the MLM loss unchanged."""
    logits = torch.randn(3, 7, 11)
    labels = torch.full((3, 7), IGNORE_INDEX)
    labels[0, 2], labels[1, 5], labels[2, 0] = 4, 9, 1
    loss = mlm_loss(logits, labels)
    other = logits.clone()
    other[labels == IGNORE_INDEX] = torch.randn_like(other[labels == IGNORE_INDEX]) * 100
    assert torch.equal(loss, mlm_loss(other, labels))
    where = labels != IGNORE_INDEX
    expect = torch.nn.functional.cross_entropy(logits[where], labels[where])
    torch.testing.assert_close(loss, expect)


def test_masked_only_head_equals_full_logits_loss():
    """masked_lm_loss (head on masked rows only) equals mlm_loss over the full (B, T, V) logits."""
    mlm = BertForMaskedLM(BertModel(tiny_config())).eval()
    ids = mlm_batch(n=4, t=12, vocab=99)
    masked, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=99, special_ids=[0, 1, 2, 3, 4],
                                 generator=torch.Generator().manual_seed(0))
    am = (ids != PAD).long()
    loss, _, _ = mlm.masked_lm_loss(masked, am, labels)
    torch.testing.assert_close(loss, mlm_loss(mlm(masked, am), labels), rtol=1e-6, atol=1e-6)


def test_masked_lm_loss_with_host_positions_equals_the_boolean_index_and_runs_on_meta():
    """masked_lm_loss with positions computed on the CPU (and without them) equals the head on the boolean index
    h[labels != -100] exactly; on the meta device, with the positions given, it runs without reading a device
    value."""
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertModel(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 99, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    labels = torch.where(torch.rand(4, 9, generator=g) < 0.3, ids, torch.full_like(ids, IGNORE_INDEX))
    labels[0, 1] = ids[0, 1]  # at least one masked position
    with torch.no_grad():
        h = mlm.bert(ids, mask)["last_hidden_state"]
        where = labels != IGNORE_INDEX
        indexed_logits = mlm.head(h[where])
        indexed = mlm_loss(indexed_logits, labels[where])
        for positions in (masked_positions(labels), None):
            loss, logits, targets = mlm.masked_lm_loss(ids, mask, labels, positions)
            assert torch.equal(loss, indexed) and torch.equal(logits, indexed_logits) and torch.equal(targets,
                                                                                                labels[where])

    meta = copy.deepcopy(mlm).to(META)
    loss, logits, _ = meta.masked_lm_loss(ids.to(META), mask.to(META), labels.to(META),
                                          masked_positions(labels).to(META))
    loss.backward()
    assert loss.device == META and logits.shape == indexed_logits.shape


def test_decoder_tied_to_word_embeddings():
    """The decoder weight is the word-embedding Parameter (same storage), before and after an update."""
    from minbert.optimizer import AdamW

    mlm = BertForMaskedLM(BertModel(tiny_config()))
    emb = mlm.bert.embeddings.word_embeddings.weight
    assert mlm.head.decoder.weight is emb
    assert mlm.head.decoder.weight.data_ptr() == emb.data_ptr()
    assert sum(p is emb for p in mlm.parameters()) == 1  # one parameter for the optimizer
    opt = AdamW(mlm.parameters(), lr=1e-2)
    mlm(torch.randint(5, 99, (2, 6))).sum().backward()
    opt.step()
    assert mlm.head.decoder.weight.data_ptr() == mlm.bert.embeddings.word_embeddings.weight.data_ptr()


def test_mlm_head_matches_transformers(tmp_path):
    """A BertForMaskedLM checkpoint's head is loaded: logits equal transformers.BertForMaskedLM's (fp32, padding)."""
    cfg = tiny_config()
    hf_cfg = transformers.BertConfig(**hf_config_dict(cfg))
    torch.manual_seed(0)
    ref = transformers.BertForMaskedLM(hf_cfg).eval()
    with torch.no_grad():  # non-trivial values for the parameters HF initialises to 0 / 1
        for name, p in ref.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    d = tmp_path / "hf"
    ref.save_pretrained(str(d))
    (d / "vocab.txt").write_text((write_vocab_dir(tmp_path) / "vocab.txt").read_text())
    assert any(k.startswith("cls.predictions.") for k in read_state_dict(d))
    mlm, _, had_head = load_mlm(d)
    assert had_head
    mlm.eval()
    ids = torch.randint(5, 99, (3, 9))
    am = torch.ones_like(ids)
    am[1, 6:] = 0
    am[2, 3:] = 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=am).logits
        got = mlm(ids, am)
    real = am.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    # and the directory we write is a BertForMaskedLM checkpoint for transformers too
    tok = BertTokenizer(d / "vocab.txt")
    out = save_mlm_checkpoint(tmp_path / "ours", mlm, tok)
    again = transformers.BertForMaskedLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, attention_mask=am).logits[real], want[real],
                                   atol=1e-5, rtol=1e-5)


def test_new_head_when_checkpoint_has_none(tmp_path, caplog):
    """A plain BertModel checkpoint gets a new head (logged as such), tied to its word embeddings."""
    cfg = tiny_config()
    d = write_hf_checkpoint(tmp_path, BertModel(cfg).state_dict(), cfg)
    with caplog.at_level(logging.INFO, logger="minbert.mlm"):
        mlm, _, had_head = load_mlm(d)
    assert not had_head
    assert "created a new one" in caplog.text
    assert torch.equal(mlm.head.bias, torch.zeros(99))
    assert mlm.head.decoder.weight is mlm.bert.embeddings.word_embeddings.weight
