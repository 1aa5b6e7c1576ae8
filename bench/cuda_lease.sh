#!/usr/bin/env bash
# What a GPU lease runs, in one call on the GPU machine, from the repository root:
#
#   OUT=/some/dir bash bench/cuda_lease.sh [SECONDS_FOR_TESTS]
#
# 1. Wheels in .whl/ (if any) install into /tmp/site: the packages the machine's image lacks,
#    downloaded beforehand for its Python (README, "On a GPU").
# 2. The CUDA-relevant tests run with their log in $OUT/pytest.log. They are stopped with SIGINT
#    at the time limit, so pytest still prints the names of the failures so far (a plain kill
#    lost them on the 2026-11-27 lease).
# 3. `bench.cuda_paths` measures every CUDA path; its baselines go to $OUT/cuda_paths.tar.gz.
# Each step writes under $OUT as it goes: what finished comes back even if the call runs out.
set -u
: "${OUT:?set OUT to the folder whose files come back}"
export PYTHONUNBUFFERED=1
tests_s=${1:-150}
start=$(date +%s)
say() { echo "[$(($(date +%s) - start)) s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/install.log" 2>&1 || { say "wheel install failed (install.log)"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"

say "tests"
timeout -s INT "$tests_s" python3 -m pytest -q -n 14 -p no:cacheprovider --timeout 110 -rfE --tb=line \
    tests/tolaria tests/tamiyo tests/kasmina tests/bench/test_training_bench.py tests/bench/test_cuda_paths.py \
    >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >>"$OUT/pytest.log"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$OUT/pytest.log"

say "cuda_paths"
python3 -m bench.cuda_paths --out /tmp/cuda_paths --epochs 5 >"$OUT/cuda_paths.log" 2>&1
echo "cuda_paths rc=$?" >>"$OUT/cuda_paths.log"
grep -E "train x|FAILED|fell back|rc=" "$OUT/cuda_paths.log"
tar czf "$OUT/cuda_paths.tar.gz" -C /tmp cuda_paths
say "done"
