"""CSV files, tokenized batches and schedules, knowing nothing of a run's configuration nor of the tasks' registry.

readers (CSV files as ``Example`` / ``Triplet`` records, with a ``ReadReport`` of every skipped row), datasets
(tokenized-once datasets, dynamic-padding collate, length-bucketed batches), schedule (which stream's batch comes
next in an epoch, and per-stream loss weights), sst_trees (the SST treebank's phrases). What a task reads, by its
entry: tasks/task.py; which examples a run reads under its configuration: tasks/selection.py; a task's prediction
and logits files: tasks/predictions.py; perturbed training sets for robustness: tasks/perturb.py.

Usage:
    from tasks.data.readers import read_examples
    examples, report = read_examples("data/ids-sst-dev.csv", ("sentence",), "sentiment", parse_label)
"""
