"""Train and evaluate the multitask BERT (SST-5, Quora paraphrase, STS): the command line.

Usage:
    python train_multitask.py                       # the CPU recipe: embedded MiniLM (its time: benchmarks/README.md)
    python train_multitask.py --help                # every flag, with its default
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32

The flags are made in tasks/arguments.py; tasks/train.py checks them and runs.
"""

from tasks.train import main

if __name__ == "__main__":
    main()
