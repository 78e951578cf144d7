"""Tests of tasks/perturb.py: robustness training subsets hit their requested sizes and rates exactly."""

from __future__ import annotations

from collections import Counter

import pytest

from tasks.perturb import few_shot, label_noise, minority
from tasks.data.readers import Example


def _sst(n: int = 1000) -> list[Example]:
    # skewed classes: 0 is rare
    labels = [0] * 50 + [1] * 200 + [2] * 250 + [3] * 300 + [4] * 200
    return [Example(str(i), f"s{i}", label=labels[i % len(labels)]) for i in range(n)]


def test_few_shot_exact_size_stratified_and_deterministic():
    """few_shot returns exactly n distinct examples, class shares within one example, same for the same seed."""
    ex = _sst()
    a = few_shot(ex, 100, seed=3)
    assert len(a) == 100 and len({e.id for e in a}) == 100
    counts = Counter(e.label for e in a)
    full = Counter(e.label for e in ex)
    for c in full:
        assert abs(counts[c] - 100 * full[c] / len(ex)) <= 1
    assert a == few_shot(ex, 100, seed=3)
    assert a != few_shot(ex, 100, seed=4)


def test_few_shot_float_labels_uniform():
    """STS-style float labels: exactly n distinct examples in file order, each example as likely as any other
    whatever its label (over 1,000 seeds every example is drawn n/N of the times, within 5 standard deviations)."""
    ex = [Example(str(i), "a", "b", label=5 * (i / 60) ** 3) for i in range(60)]  # labels crowded near 0
    n, seeds = 15, 1000
    drawn = Counter()
    for seed in range(seeds):
        ids = [int(e.id) for e in few_shot(ex, n, seed=seed)]
        assert len(ids) == n and ids == sorted(set(ids))
        drawn.update(ids)
    p = n / len(ex)
    mean, sd = seeds * p, (seeds * p * (1 - p)) ** 0.5
    assert all(abs(drawn[i] - mean) < 5 * sd for i in range(len(ex))), sorted(drawn.items())


def test_label_noise_exact_rate_and_always_changes_label():
    """Exactly round(p·N) labels change, each to a different valid class; the rest are untouched."""
    ex = _sst()
    noisy, flipped = label_noise(ex, 0.1, num_classes=5, seed=0)
    changed = [i for i, (a, b) in enumerate(zip(ex, noisy)) if a.label != b.label]
    assert changed == flipped and len(changed) == 100
    assert all(0 <= e.label < 5 for e in noisy)


def test_minority_keeps_exact_share_of_one_class_only():
    """minority keeps round(r·n_c) of class c and every example of other classes."""
    ex = _sst()
    out = minority(ex, label=3, keep=0.1, seed=0)
    c_in, c_out = Counter(e.label for e in ex), Counter(e.label for e in out)
    assert c_out[3] == round(0.1 * c_in[3])
    assert all(c_out[c] == c_in[c] for c in c_in if c != 3)


def test_bad_rates_raise():
    """Rates outside [0, 1] and absent classes are refused with a message."""
    with pytest.raises(ValueError, match="rate"):
        label_noise(_sst(), 1.5, 5, 0)
    with pytest.raises(ValueError, match="no training example has label 9"):
        minority(_sst(), 9, 0.5, 0)


def test_perturbed_files_round_trip_through_the_readers(tmp_path):
    """Rewritten train files parse back to the same examples; other files are links to the originals."""
    from tasks.perturb import perturbed_data_dir
    from tasks.task import load_split

    src = tmp_path / "src"
    src.mkdir()
    (src / "ids-sst-dev.csv").write_text("\tid\tsentence\tsentiment\n0\td0\t a dev one\t2\n")
    sst = [Example(f"s{i}", f'quote " and\ttab-free text {i}', label=i % 5) for i in range(7)]
    para = [Example(f"p{i}", f"q{i}", f"r{i}", label=float(i % 2)) for i in range(5)]
    out = perturbed_data_dir(src, tmp_path / "dst", {"sst": sst, "para": para})
    assert load_split("sst", "train", out)[0] == sst
    got = load_split("para", "train", out)[0]
    assert [(e.id, e.text_a, e.text_b, e.label) for e in got] == [(e.id, e.text_a, e.text_b, e.label) for e in para]
    assert (out / "ids-sst-dev.csv").is_symlink()


def test_a_written_file_holds_the_labels_as_its_kind_writes_them(tmp_path):
    """Quora's one-logit labels as its files write them (0.0 / 1.0), whatever number they came as; SST's class
    ids as they are (the kind decides: Kind.file_label)."""
    from tasks.perturb import write_task_file

    write_task_file(tmp_path / "para.csv", "para", [Example(f"p{i}", "a", "b", label=i % 2) for i in range(2)])
    write_task_file(tmp_path / "sst.csv", "sst", [Example(f"s{i}", "a", label=i) for i in range(2)])
    assert [line.rsplit("\t", 1)[1] for line in (tmp_path / "para.csv").read_text().splitlines()[1:]] == ["0.0", "1.0"]
    assert [line.rsplit("\t", 1)[1] for line in (tmp_path / "sst.csv").read_text().splitlines()[1:]] == ["0", "1"]


def test_a_task_whose_files_are_not_in_the_data_dir_is_refused_and_its_file_kept(tmp_path):
    """A user's task (--task-file) reads its own files, not --data-dir's: a perturbed copy cannot stand in for its
    training file, so the experiment is refused, and the user's file keeps its bytes."""
    import dataclasses

    from tasks.perturb import perturbed_data_dir
    from tasks.task import Tasks, get_task

    own = tmp_path / "mine-train.csv"
    own.write_text("\tid\tsentence\tsentiment\n0\ta\tthe user's own\t1\n")
    entry = dataclasses.replace(get_task("sst"), name="mine", files={**get_task("sst").files, "train": str(own)})
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match="mine"):
        perturbed_data_dir(tmp_path / "src", tmp_path / "dst", {"mine": [Example("x", "changed", label=0)]},
                           Tasks([entry]))
    assert own.read_text() == "\tid\tsentence\tsentiment\n0\ta\tthe user's own\t1\n"
