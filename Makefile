# The two commands of the README: each sets up .venv on first use (bash setup.sh), then runs its job.
#
#   make train                                   # train the default model into runs/default
#   make test                                    # the test suite (CPU, one process per core, at most 4)
#   make train ARGS="--limit 64 --epochs 1 --out-dir runs/smoke"   # flags for the command (ARGS)
#
# The set-up runs again only when a file it installs from is newer than its last success; otherwise one line
# says it is done. `bash setup.sh` redoes it by hand. After either command, `source .venv/bin/activate` puts
# python and the minbert-* commands of the README on the PATH.

# the suite in one process per core, at most 4 (pytest-xdist; tests/conftest.py gives each its share of the
# threads), a test file's tests in one process (their module fixtures are built once)
PARALLEL := -n auto --maxprocesses 4 --dist loadfile
SETUP_INPUTS := setup.sh pyproject.toml requirements.txt requirements-test.txt
STAMP := .venv/.setup-done

.PHONY: train test setup

train: setup
	.venv/bin/python train_multitask.py $(ARGS)

test: setup
	.venv/bin/python -m pytest -q $(PARALLEL) $(ARGS)

setup:
	@if [ -f $(STAMP) ] && [ -z "$$(find $(SETUP_INPUTS) -newer $(STAMP))" ]; then \
		echo "make: set-up already done (.venv is newer than $(SETUP_INPUTS); bash setup.sh redoes it)"; \
	else \
		bash setup.sh; \
	fi
