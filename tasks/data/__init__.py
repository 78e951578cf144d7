"""The files and batches of the tasks, knowing nothing of a run's configuration.

readers (the CS224N CSV files as ``Example`` / ``Triplet`` records, with a
``ReadReport`` of every skipped row), datasets (tokenized-once datasets,
dynamic-padding collate, length-bucketed batches), predictions (the leaderboard's
prediction files and our logits files, and several runs' logits read together),
schedule (which task's batch comes next in an epoch, and per-task loss weights),
perturb (few-shot, label-noise and minority training sets for the robustness
experiments, written as a data directory). Which examples a run reads under its
configuration: tasks/selection.py.

Usage:
    from tasks.data.readers import read_examples
    examples, report = read_examples("data/ids-sst-dev.csv", ("sentence",), "sentiment", parse_label)
"""
