"""Tests of tasks/selection.py: which examples a run reads (the fixed dev subsets, the dataset of each task)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.train_config import TrainConfig
from tasks.options import replace_at
from tasks.data.datasets import PairDataset, SentenceDataset
from tasks.data.readers import Example
from tasks.task import get_task
from tasks.selection import capped_dev, fixed_subset, load_stream, make_dataset
from tasks.model import ModelConfig
from tests.helpers import WordTokenizer

EXAMPLES = [Example(f"x{i}", f"sentence number {i}", None, i % 5) for i in range(100)]


def test_fixed_subset_is_seeded_in_file_order_and_whole_when_not_capped():
    """n of the examples, kept in file order, the same for the same seed and another for another seed; asking for
    as many or more gives the list itself."""
    subset = fixed_subset(EXAMPLES, 10, seed=0)
    positions = [EXAMPLES.index(e) for e in subset]
    assert len(subset) == 10 and positions == sorted(positions) and len(set(positions)) == 10
    assert fixed_subset(EXAMPLES, 10, seed=0) == subset
    assert fixed_subset(EXAMPLES, 10, seed=1) != subset
    assert fixed_subset(EXAMPLES, 100, seed=0) is EXAMPLES and fixed_subset(EXAMPLES, 500, seed=0) is EXAMPLES


def test_capped_dev_caps_only_the_tasks_it_names():
    """dev_max_examples caps a task's between-epoch dev set to the run seed's fixed subset; other tasks keep theirs."""
    cfg = TrainConfig(dev_max_examples={"para": 8}, seed=3)
    assert capped_dev("para", EXAMPLES, cfg) == fixed_subset(EXAMPLES, 8, seed=3)
    assert capped_dev("sst", EXAMPLES, cfg) is EXAMPLES
    assert capped_dev("para", EXAMPLES[:8], cfg) == EXAMPLES[:8]


def test_make_dataset_follows_the_task_and_the_models_pair_encoding():
    """SST reads single sentences; pairs are encoded as the model's pair_encoding says (Siamese: two sequences);
    max_length cuts every sequence."""
    tok = WordTokenizer()
    pairs = [Example(f"p{i}", "a long first sentence of many words", "and a second one", 1.0) for i in range(3)]
    sst = make_dataset("sst", EXAMPLES[:3], tok, TrainConfig(max_length=4))
    assert isinstance(sst, SentenceDataset) and sst.collate([0, 1, 2])["input_ids"].shape == (3, 4)
    for encoding, keys in (("siamese", {"input_ids_1", "input_ids_2"}), ("cross", {"input_ids"})):
        cfg = TrainConfig(max_length=6, model=ModelConfig(pair_encoding=encoding))
        batch = make_dataset("para", pairs, tok, cfg).collate([0, 1, 2])
        assert isinstance(make_dataset("sts", pairs, tok, cfg), PairDataset)
        assert {k for k in batch if k.startswith("input_ids")} == keys
        assert all(batch[k].shape[1] == 6 for k in keys)


def _phrases(read, cfg):
    """``read`` (``load_stream``, ``stream_file``) of the SST phrases as ``cfg`` resolves them."""
    return read(cfg, cfg.resolve().extra["phrases"])


def test_phrases_are_read_as_sst_rows_with_short_ones_left_out_and_counted(tiny_env):
    """--sst-phrases: a name is looked up in --data-dir; phrases of fewer than min-words words are dropped and
    counted in the file's report; a missing file names the flag and the path."""
    _, data = tiny_env
    cfg = TrainConfig(data_dir=str(data), stream_min_words={"phrases": 3})
    phrases, report = _phrases(load_stream, cfg)
    everything, _ = get_task("sst").read("train", ".", path=data / "sst-phrases-train.csv")
    assert phrases == [p for p in everything if len(p.text_a.split()) >= 3] and 0 < len(phrases) < len(everything)
    assert report["kept"] == len(everything) and report["shorter_than_min_words"] == len(everything) - len(phrases)
    assert report["sha256"]
    absolute = replace_at(replace_at(cfg, "data_dir", "elsewhere"), "stream_files",
                          {"phrases": str(data / "sst-phrases-train.csv")})
    assert _phrases(load_stream, absolute)[0] == phrases
    with pytest.raises(FileNotFoundError, match=r"--sst-phrases nope.csv: no such file .*nope.csv.*build it from the "
                       r"treebank's trees \(python -m tasks.sst_phrases TREES --out .*nope.csv.*--sst-phrases none"):
        _phrases(load_stream, replace_at(cfg, "stream_files", {"phrases": "nope.csv"}))
    with pytest.raises(ValueError, match="no phrase of 9 or more words"):
        _phrases(load_stream, replace_at(cfg, "stream_min_words", {"phrases": 9}))


def test_a_phrase_file_is_a_name_in_data_dir_or_a_path(tiny_env, tmp_path, monkeypatch):
    """--sst-phrases NAME is looked up in --data-dir; a path (with a folder in it) is a path, from the working
    directory, as the flag's help says."""
    from tasks.selection import stream_file
    _, data = tiny_env
    (tmp_path / "mine").mkdir()
    own = tmp_path / "mine" / "phrases.csv"
    own.write_text((data / "sst-phrases-train.csv").read_text())
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(data_dir=str(data))
    assert _phrases(stream_file, cfg) == data / "sst-phrases-train.csv"
    mine = replace_at(cfg, "stream_files", {"phrases": "mine/phrases.csv"})
    assert _phrases(stream_file, mine) == Path("mine/phrases.csv")
    assert _phrases(stream_file, replace_at(cfg, "stream_files", {"phrases": str(own)})) == own


def test_a_phrase_file_without_one_valid_row_says_why_each_was_skipped(tiny_env, tmp_path):
    """Every label bad: the refusal gives the file's skip report (line and reason), not a count of words."""
    _, data = tiny_env
    bad = tmp_path / "bad.csv"
    bad.write_text("\tid\tsentence\tsentiment\n0\tp0\ta fine film\t7\n1\tp1\tdull\tx\n")
    cfg = TrainConfig(data_dir=str(data), stream_files={"phrases": str(bad)}, limit=None)
    with pytest.raises(ValueError, match=r"no valid row.*line 2: label '7' out of range 0\.\.4.*line 3: label 'x'"):
        _phrases(load_stream, cfg)
