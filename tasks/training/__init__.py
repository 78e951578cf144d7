"""Training: the loop, what plugs into it, and what a run leaves on disk.

trainer (the ``Trainer``: one epoch loop for every task, schedule and
objective), run (a whole run: fit, best checkpoint, SWA, predictions, final
record), lpft (the linear-probing stage before full fine-tuning), swa
(stochastic weight averaging after training), checkpoint (atomic checkpoint
directories of safetensors and JSON), rundir (the run directory, its
metrics.jsonl and its lock), progress (loss sums, log lines and training.png),
runtime (device, precision, seeding and memory policy), distributed (torchrun
data parallel), mlm (masked-LM pretraining of the encoder: head, loop and its
resumable state).

Usage:
    from tasks.training.run import run
    summary = run(TrainConfig(out_dir="runs/try"))
"""
