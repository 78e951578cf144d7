"""Train and evaluate the multitask BERT (SST-5, Quora paraphrase, STS): the command line.

Usage:
    python train_multitask.py                       # the CPU recipe: embedded MiniLM, about 10 minutes on 2 cores
    python train_multitask.py --help                # every flag, with its default
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32

The flags, their checks and what runs are in tasks/cli.py.
"""

from tasks.train import main

if __name__ == "__main__":
    main()
