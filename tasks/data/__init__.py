"""The data of a run: reading the task files, tokenizing them, choosing and ordering the examples.

readers (the CS224N CSV files as ``Example`` / ``Triplet`` records, with a
``ReadReport`` of every skipped row), datasets (tokenized-once datasets,
dynamic-padding collate, length-bucketed batches), selection (which examples a
run reads: its ``--limit``, the fixed dev subsets, the tokenized datasets of a
config), schedule (which task's batch comes next in an epoch, and per-task loss
weights), perturb (few-shot, label-noise and minority training sets for the
robustness experiments, written as a data directory).

Usage:
    from tasks.data.selection import load_run_data
    data = load_run_data(cfg, tokenizer)   # data.train_sets, .dev_sets, .final_examples, .reports
"""
