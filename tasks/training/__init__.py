"""Training: one loop, what plugs into it, and what a run leaves on disk.

loop (``Loop``: epochs of planned steps, each a batch, an optimizer step and
events for hooks; ``Hook``, the ``TrainingState`` a hook sees and the
``Control`` it steers with), trainer (``Trainer``: multitask fine-tuning on
the loop, its stages in order), stages (LP-FT's heads-only stage, fine-tuning,
SWA's averaging stage), hooks (a run's own: log lines and their clock,
progress bar, checkpoints every N steps, metrics.jsonl, training.png), tensorboard (the --report-to tensorboard hook),
optim (AdamW's parameter groups, lr factors and schedules, the batch plan),
run (a fine-tuning run: checks, parts, hooks, fit, predictions, final record),
mlm (BERT's masking, the masking collator and the MLM loss),
pretraining (masked-LM pretraining on the loop and the checkpoint it leaves),
rundir (the run directory, its metrics.jsonl and its lock), progress (loss
sums, the run's clock, training.png), distributed (torchrun data parallel),
robustness (the perturbed-data experiments and the embedding-space PGD attack).

Usage:
    from tasks.training.run import run
    summary = run(TrainConfig(out_dir="runs/try"))                  # your hooks: run(cfg, hooks=[MyHook()])
"""
