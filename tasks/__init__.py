"""Everything multitask, grouped by role.

The parts: task (the tasks as data: entries, the package's and a run's resolved once, each of a kind that owns
its head, loss, metric and files), config (``TrainConfig``: a run's settings, its presets and checks), model (``MultitaskBert``: encoder,
shared layers, task heads), data/ (reading, tokenizing, batching and ordering examples), selection (which
examples a run reads), objectives/ (one plug-in objective per file), training/ (the ``Trainer`` and what plugs
into it, a whole run and its directory, masked-LM pretraining, torchrun), evaluation/ (metrics, the evaluator,
the priors, ensembles), predictions (the prediction and logits files), checkpoint (a checkpoint's layout,
written and read back), perturb (perturbed training sets). Beneath them: options (the one flag mechanism:
dataclass fields become flags), runtime (device and process policy), storage (atomic JSON and safetensors
writers), outdir (whose an output directory is, and its lock), logs (every command's log).

The commands users run are thin modules over them: train (``train_multitask.py``, tasks/train.py, its flags in
tasks/arguments.py), predict, ensemble, pretrain, robustness and sst_phrases (``python -m tasks.X``), each
parsing its flags and reporting a user's error with tasks.cli; tasks/scripts.py installs them as console scripts.

Usage:
    from tasks.training.run import run
    summary = run(TrainConfig(out_dir="runs/try"))   # what train_multitask.py --out-dir runs/try trains
"""
