#!/usr/bin/env bash
# What a GPU lease runs, in one call on the GPU machine, from the repository root:
#
#   OUT=/some/dir bash bench/cuda_lease.sh [SECONDS_FOR_ALL]
#
# Every step has its own share of the time (SECONDS_FOR_ALL, default 480, leaves a 10-minute
# call room for the machine's start and the transfers), is stopped with SIGINT when it runs out
# (pytest and Python still print what they have), and writes under $OUT as it goes: what
# finished comes back even if the call runs out. In order of what a lease has never measured:
# 1. Wheels in .whl/ (if any) install into /tmp/site: the packages the machine's image lacks,
#    downloaded beforehand for its Python (docs/gpu.md, "Running a lease").
# 2. `bench.cuda_growth`: a width seed's and a stacked block's lifecycle under CUDA graphs (one
#    capture per structure change), eager beside graphed.
# 3. The CUDA-relevant tests, their log in $OUT/pytest.log.
# 4. The first-epoch timeline of `esper -v run` on CUDA with fresh homes (Prefect's temporary
#    server included).
# 5. `bench.cuda_paths`: every CUDA path of the recipes, growing ones first, until time runs out;
#    its baselines go to $OUT/cuda_paths.tar.gz.
set -u
: "${OUT:?set OUT to the folder whose files come back}"
export PYTHONUNBUFFERED=1
total_s=${1:-480}
start=$(date +%s)
say() { echo "[$(($(date +%s) - start)) s] $*"; }
left() { echo $((total_s - ($(date +%s) - start))); }
# At most $1 seconds for the next step, never past the end of the whole.
share() { local l; l=$(left); echo $(($1 < l ? $1 : (l > 5 ? l : 5))); }

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/install.log" 2>&1 || { say "wheel install failed (install.log)"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
say "installed"

say "cuda_growth"
timeout -k 10 -s INT "$(share 150)" python3 -m bench.cuda_growth --out "$OUT" >"$OUT/cuda_growth.log" 2>&1
echo "cuda_growth rc=$?" >>"$OUT/cuda_growth.log"
grep -E "captures|rc=|Error" "$OUT/cuda_growth.log" | grep -v "^    epoch" | head -20

say "tests"
timeout -k 10 -s INT "$(share 120)" python3 -m pytest -q -n 14 -p no:cacheprovider --timeout 100 -rfE --tb=line \
    tests/tolaria tests/tamiyo tests/kasmina tests/bench/test_training_bench.py tests/bench/test_cuda_paths.py \
    tests/bench/test_cuda_growth.py >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >>"$OUT/pytest.log"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$OUT/pytest.log"

say "first epoch"
export ESPER_HOME=/tmp/esper-home PREFECT_HOME=/tmp/prefect-home
timeout -k 10 -s INT "$(share 90)" python3 -m esper_cli -v run --recipe mnist1d-cnn --device cuda --epochs 3 \
    >"$OUT/first_epoch.log" 2>&1
echo "esper run rc=$?" >>"$OUT/first_epoch.log"
grep -E "^  [a-zA-Z]|rc=|Error" "$OUT/first_epoch.log" | head -20
unset ESPER_HOME PREFECT_HOME

say "cuda_paths"
# Its ~15 baselines go back as one archive: a lease returns at most 8 files from $OUT.
timeout -k 10 -s INT "$(share 600)" python3 -m bench.cuda_paths --out /tmp/cuda_paths --epochs 5 >"$OUT/cuda_paths.log" 2>&1
echo "cuda_paths rc=$?" >>"$OUT/cuda_paths.log"
grep -E "train x|FAILED|fell back|rc=" "$OUT/cuda_paths.log"
tar czf "$OUT/cuda_paths.tar.gz" -C /tmp cuda_paths
say "done"
