"""Evaluation: turning a model into scores, predictions and files.

metrics (the task metrics and the overall score), evaluator (the one path from
a model to predictions: dev metrics during training, --eval-only, the files of
a run and the ``Predictor`` API), priors (a frozen sentence encoder blended in
at evaluation), ensemble (combining the saved logits of several runs, and the
submission zip). The ``Predictions`` container and the leaderboard and logits
files it is written to are tasks/predictions.py.

Usage:
    from tasks.evaluation.evaluator import evaluate_checkpoint
    result = evaluate_checkpoint("runs/try/checkpoints/best")
"""
