"""Tests of experiments/token_budget.py: training tokens counted per planned example, one-line refusals."""

from __future__ import annotations

import pytest


def test_training_tokens_count_every_planned_example_once_per_appearance():
    """token_budget counts the real tokens of each planned example: an uncapped epoch is every example once,
    Siamese pairs count both sides, a swapped pair (index i + N) counts as pair i, SWA epochs are included."""
    from experiments.token_budget import example_tokens, training_tokens
    from tasks.train_config import SwaConfig, TrainConfig
    from tasks.data.datasets import PairDataset, SentenceDataset
    from tasks.data.readers import Example
    from tests.helpers import WordTokenizer

    tok = WordTokenizer()
    sst = SentenceDataset([Example(f"s{i}", "w " * (i + 1)) for i in range(10)], tok)
    pairs = [Example(f"p{i}", "a " * (i + 1), "b " * (2 * i + 1), 1.0) for i in range(12)]
    cross, siamese = PairDataset(pairs, tok, mode="cross"), PairDataset(pairs, tok, mode="siamese")
    assert example_tokens(sst) == [i + 3 for i in range(10)]  # [CLS] w.. [SEP]: i + 1 words + 2
    assert example_tokens(cross) == [3 * i + 5 for i in range(12)]  # [CLS] a [SEP] b [SEP]
    assert example_tokens(siamese) == [3 * i + 6 for i in range(12)]  # [CLS] a [SEP], [CLS] b [SEP]
    cfg = TrainConfig(tasks=("sst", "para"), batch_size=4, epochs=2, max_train_examples={}, pair_swap=0.5)
    totals = training_tokens(cfg, {"sst": sst, "para": cross})
    assert totals == {"sst": 2 * sum(example_tokens(sst)), "para": 2 * sum(example_tokens(cross))}
    capped = TrainConfig(tasks=("sst", "para"), batch_size=4, epochs=1, swa=SwaConfig(epochs=2),
                         max_train_examples={"para": 4}, train_subsets="cycle")
    assert training_tokens(capped, {"sst": sst, "para": siamese})["para"] == sum(example_tokens(siamese))  # 3 x 4


def test_token_budget_refuses_bad_flags_and_missing_data_in_one_line(tmp_path, capsys):
    """A flag train_multitask.py refuses ends with exit status 2, a data file that is not there with exit status
    1; both name the recipe and neither is a traceback."""
    from experiments import token_budget

    with pytest.raises(SystemExit) as e:
        token_budget.main(["--candidate=--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized argument --bogus" in err and "candidate '--bogus'" in err
    with pytest.raises(SystemExit) as e:
        token_budget.main([f"--candidate=--pretrained {tmp_path / 'no'}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"no checkpoint directory at {tmp_path / 'no'}" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        token_budget.main([f"--candidate=--data-dir {tmp_path} --sst-phrases none"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and f"{tmp_path}/ids-sst-train.csv" in err and "Traceback" not in err
    assert err.startswith("python -m experiments.token_budget: error: ") and len(err.strip().splitlines()) == 1
