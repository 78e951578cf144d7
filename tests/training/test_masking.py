"""Tests of tasks/training/masking.py: BERT's masking and the masking collator (the head: tests/minbert/test_mlm.py; the
pretraining run on the loop: tests/training/test_pretraining.py)."""

from __future__ import annotations

import torch

from minbert.mlm import IGNORE_INDEX
from minbert.tokenizer import BertTokenizer
from tasks.training.masking import MaskingCollator, mask_tokens
from tests.helpers import mlm_batch, write_vocab_dir

PAD, UNK, CLS, SEP, MASK = range(5)


def test_masking_rate_and_never_specials():
    """About 15% of ordinary tokens are chosen; [CLS]/[SEP]/[PAD]/[UNK] never are, and stay unchanged."""
    ids = mlm_batch()
    g = torch.Generator().manual_seed(1)
    masked, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=1000, special_ids=[PAD, UNK, CLS, SEP, MASK],
                                 generator=g)
    special = torch.isin(ids, torch.tensor([PAD, UNK, CLS, SEP]))
    chosen = labels != IGNORE_INDEX
    assert not (chosen & special).any()
    assert torch.equal(masked[special], ids[special])
    rate = chosen.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.01, rate
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(masked[~chosen], ids[~chosen])  # only chosen positions change


def test_80_10_10_rule():
    """Of the chosen tokens ~80% become [MASK], ~10% a random non-special token, ~10% stay as they were."""
    ids = mlm_batch(n=4000)  # ~11,000 chosen tokens: the 10% shares have a standard deviation of 0.003
    g = torch.Generator().manual_seed(2)
    masked, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=1000, special_ids=[PAD, UNK, CLS, SEP, MASK],
                                 generator=g)
    chosen = labels != IGNORE_INDEX
    n = chosen.sum().item()
    to_mask = (masked[chosen] == MASK).sum().item() / n
    kept = (masked[chosen] == ids[chosen]).sum().item() / n
    replaced = masked[chosen][(masked[chosen] != MASK) & (masked[chosen] != ids[chosen])]
    assert abs(to_mask - 0.8) < 0.02
    assert abs(kept - 0.1) < 0.015  # 1/995 of the random draws hit the original token too
    assert abs(replaced.numel() / n - 0.1) < 0.015
    assert replaced.min() >= 5  # never a special token


def test_masking_is_seeded_and_never_empty():
    """The same generator seed gives the same masks; a batch of tiny sentences still gets one masked token."""
    ids = mlm_batch()
    a = mask_tokens(ids, mask_token_id=MASK, vocab_size=1000, special_ids=[0, 1, 2, 3, 4],
                    generator=torch.Generator().manual_seed(3))
    b = mask_tokens(ids, mask_token_id=MASK, vocab_size=1000, special_ids=[0, 1, 2, 3, 4],
                    generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    tiny = torch.tensor([[CLS, 7, SEP]])
    for seed in range(20):
        _, labels = mask_tokens(tiny, mask_token_id=MASK, vocab_size=99, special_ids=[0, 1, 2, 3, 4],
                                generator=torch.Generator().manual_seed(seed))
        assert labels.tolist() == [[IGNORE_INDEX, 7, IGNORE_INDEX]]


def _collator(tmp_path) -> MaskingCollator:
    tok = BertTokenizer(write_vocab_dir(tmp_path) / "vocab.txt")
    g = torch.Generator().manual_seed(0)
    sentences = [" ".join(f"w{j}" for j in torch.randint(0, 30, (int(n),), generator=g).tolist())
                 for n in torch.randint(3, 12, (10,), generator=g)]
    return MaskingCollator(tok, sentences, max_length=16, batch_size=4, mlm_probability=0.15, seed=0)


def _epochs(collator: MaskingCollator, epochs: int, skip: int = 0) -> list[list]:
    """Each epoch's batches, each collated (the first ``skip`` batches of the first epoch drawn but not collated)."""
    out = []
    for e in range(epochs):
        batches = collator.epoch_batches()
        out.append([(b, collator.collate(b)) for b in batches[skip if e == 0 else 0:]])
    return out


def test_a_collator_restored_from_its_state_goes_on_as_the_uninterrupted_one(tmp_path):
    """The state taken after two batches of epoch 2 (as a checkpoint keeps it), given to a fresh collator: its next
    epoch is epoch 2's batches again, and the masks of batches 3 on and of epoch 3 are the uninterrupted run's."""
    whole = _epochs(_collator(tmp_path), 3)
    cut = _collator(tmp_path)
    _epochs(cut, 1)
    for b in cut.epoch_batches()[:2]:
        cut.collate(b)
    state = cut.state()
    resumed = _collator(tmp_path)
    resumed.load_state(state)
    again = _epochs(resumed, 2, skip=2)
    assert [b for b, _ in whole[1][2:]] == [b for b, _ in again[0]] and whole[2][0][0] == again[1][0][0]
    for (_, want), (_, got) in zip(whole[1][2:] + whole[2], again[0] + again[1]):
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) if isinstance(want[k], torch.Tensor) else want[k] == got[k]
                   for k in want)
    assert whole[0][0][1]["tokens"] == int(whole[0][0][1]["attention_mask"].sum())

