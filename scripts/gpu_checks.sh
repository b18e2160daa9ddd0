#!/usr/bin/env bash
# The GPU checks of one lent device session, in one go (README, "On a GPU"): the gpu tests,
# the framework tests with the frameworks on CUDA, bench_gpu cut down to fit, and a script
# search on CUDA. Each part has its own time limit so that a hang in one leaves the others'
# output. Logs go to $OUT (or ./gpu-out).
#
#   bash scripts/gpu_checks.sh                     # every part: about 12 minutes on an H200
#   bash scripts/gpu_checks.sh pytest frameworks   # some of pytest (1.5 min), frameworks (6),
#                                                  # bench (3) and search (1)
#
# Packages the machine lacks travel as wheels in .whl/ (optuna and its needs), installed first.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
    export PYTHONPATH=$PWD
fi
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nproc
    python3 -c "import torch, optuna; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'optuna', optuna.__version__)"
} 2>&1 | tee "$out/machine.txt"
parts=${*:-pytest frameworks bench search}
wants() { [[ " $parts " == *" $1 "* ]]; }

if wants pytest; then
echo "== pytest -m gpu" | tee "$out/pytest.log"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee -a "$out/pytest.log"
fi

if wants frameworks; then
# Lightning, Accelerate and the Hugging Face Trainer as they run by default on a GPU machine.
echo "== framework tests on CUDA" | tee "$out/frameworks.log"
LOADERTUNE_TEST_CUDA=1 timeout 480 python3 -m pytest -m frameworks -v -p no:cacheprovider --durations=6 \
    tests/test_frameworks.py -k "lightning or accelerate or hugging" 2>&1 | tee -a "$out/frameworks.log"
fi

if wants bench; then
echo "== bench_gpu" | tee "$out/bench_gpu.log"
timeout 300 python3 scripts/bench_gpu.py --batch-sizes 128,256 --workers 0,4,8,16 --budget 30 \
    --rounds 2 --window 1.0 --grid-window 0.75 --n-images 4000 --out "$out/bench_gpu.json" \
    2>&1 | tee -a "$out/bench_gpu.log"
fi

if wants search; then
echo "== script search on CUDA" | tee "$out/search.log"
timeout 150 python3 -m loadertune search examples/train_images.py --budget 45 --fresh \
    --batch-sizes 64,128,256 --show-trials --out "$out/loadertune.json" -- --epochs 3 --n-images 4000 \
    2>&1 | tee -a "$out/search.log"
echo "left running: $(pgrep -fc 'loadertune search|train_images.py')" | tee -a "$out/search.log"
fi
