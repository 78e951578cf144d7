"""Everything multitask, grouped by role.

config (``TrainConfig``, its presets and validation), model (``MultitaskBert``:
encoder, shared layers, task heads), data/ (reading, tokenizing, choosing and
ordering examples), objectives/ (one plug-in objective per file), training/
(the Trainer, checkpoints, the run directory, device policy), evaluation/
(metrics, the evaluator, prediction files, ensembles). The commands users run
are thin modules over them: train (``train_multitask.py``), predict, ensemble,
pretrain and robustness (``python -m tasks.X``), all parsing their flags with
tasks.cli.
"""
