#!/bin/bash
# Issue 39's LengthDrop protocol on one GPU in one device call (benchmarks/length/protocols/length_adaptive_5ep.json):
# 5 LengthDrop epochs x 3 seeds. Prepare here (the project root, .venv and ../shared/tools/device_prep.sh's
# .devcarry built; the carry must stay under the 64 MiB limit with the tree):
#   echo /.lacarry/ >> .git/info/exclude; bash benchmarks/length/length_adaptive_device.sh prep
# then run it there with carry [".lacarry"]: bash benchmarks/length/length_adaptive_device.sh
# It trains the three seeds side by side (one process each, --train-only), then one process evaluates,
# searches on validation, reads the test split and times every seed alone, and writes the rows and the
# summary under $OUT (length_adaptive_runs.jsonl, length_adaptive.json, logs); here, copy the rows file
# to benchmarks/length/runs/length_adaptive_runs.jsonl and the JSON to benchmarks/length/results/. Env: LD_STEPS
# (default 1452 = 5 epochs), SEEDS (default "0 1 2": a call that ran out of time can be followed by one
# for the missing seeds), BUDGET (seconds of this script after which nothing new starts: 570).
# SMOKE=1 PY=.venv/bin/python OUT=/tmp/la_out: the same script on this CPU at --smoke sizes (prep with
# SMOKE=1 first): what the tests of this path are.
# V3=1 (prep and run): issue 67's protocol (benchmarks/length/protocols/length_adaptive_v3.json): the whole
# test set in the carry, --v3 (seeded budgets, the LengthDrop-steps curve; the search runs in the training
# processes), and the CUDA tests of the length-adaptive paths beside the training (TESTS=0 skips them):
# the session's one device call holds both.
set -u
export PYTHONUNBUFFERED=1
carry=.lacarry
PY=${PY:-python3}
if [ "${1:-run}" = prep ]; then  # here: wheels, the packed checkpoint, the data, the commit
  [ -d .devcarry/whl ] && [ -d .devcarry/minilm ] || { echo "run ../shared/tools/device_prep.sh .devcarry first"; exit 2; }
  rm -rf $carry && mkdir -p $carry/whl
  cp .devcarry/whl/{pydantic,pydantic_core,annotated_types,typing_inspection,datasets,dill,multiprocess}-*.whl $carry/whl/
  if [ -f .devcarry/minilm/model.planes.json ]; then cp -r .devcarry/minilm $carry/minilm  # packed already
  else .venv/bin/python benchmarks/gpu/device_pack.py pack .devcarry/minilm $carry/minilm || exit 3; fi
  data=$(.venv/bin/python - "${SMOKE:-0}" "${V3:-0}" <<'PY'
import sys
from pathlib import Path
from benchmarks.length import length_adaptive as la
work = Path("/tmp/length_adaptive_v2")
work.mkdir(parents=True, exist_ok=True)
s = la.SMOKE if sys.argv[1] == "1" else {"val_n": la.VAL_N, "test_n": None if sys.argv[2] == "1" else la.TEST_N,
                                        "train_n": None}
print(la.newsgroups_dir(work, s["val_n"], s["test_n"], s["train_n"]))
PY
) || exit 4
  tar -C "$(dirname "$data")" -cf - "$(basename "$data")" | xz -9 -T2 > $carry/20ng.tar.xz || exit 5
  git rev-parse HEAD > $carry/commit
  du -sb $carry; echo "tree + carry: $(( ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -sb $carry | cut -f1)) / 1048576 )) MiB (limit 64)"
  exit 0
fi
: "${OUT:?OUT must name the folder the results go to}"
if [ "${SMOKE:-0}" = 1 ]; then
  size="--smoke --device cpu --threads 1" tmp=$(mktemp -d)
else
  size="--device cuda --threads 4" tmp=/tmp
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $carry/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
$PY benchmarks/gpu/device_pack.py unpack $carry/minilm $tmp/minilm || exit 4
mkdir -p $tmp/20ng && tar -C $tmp/20ng -xJf $carry/20ng.tar.xz || exit 5
export ARCHSEARCH_COMMIT=$(cat $carry/commit)
v3=""; [ "${V3:-0}" = 1 ] && v3="--v3"
args="$size $v3 --ld-from full --ld-steps ${LD_STEPS:-1452} --ckpt $tmp/minilm --data $(ls -d $tmp/20ng/*) --work $tmp/la"
echo "set-up done at ${SECONDS}s"
for s in ${SEEDS:-0 1 2}; do  # training side by side: each process waits on its own kernels, the GPU is shared
  timeout $((${BUDGET:-570} - SECONDS)) $PY -m benchmarks.length.length_adaptive run $args --seeds $s --train-only \
    > "$OUT/train_s$s.log" 2>&1 &
done
if [ "${V3:-0}" = 1 ] && [ "${TESTS:-1}" = 1 ] && [ "${SMOKE:-0}" != 1 ]; then  # beside the training: 4 of 16 cores
  xd=$($PY -c "import xdist" 2>/dev/null && echo "-n 3")
  ARCHSEARCH_TEST_DEVICE=cuda timeout 200 $PY -m pytest -q -p no:cacheprovider $xd \
    tests/test_length_drop.py tests/test_devices.py tests/test_cascade_graphs.py tests/test_confidence_exit.py \
    tests/test_dht.py tests/test_exit_heads.py -m "not slow and not ray" > "$OUT/tests.log" 2>&1 &
fi
wait
[ -f "$OUT/tests.log" ] && grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -15
echo "training done at ${SECONDS}s"; grep -h "seed" "$OUT"/train_s*.log
# then every seed alone: search (validation), test, wall clock; a row per seed as it finishes
timeout $((${BUDGET:-570} - SECONDS)) $PY -m benchmarks.length.length_adaptive run $args --seeds "$(echo ${SEEDS:-0 1 2} | tr ' ' ,)" --resume \
  --runs "$OUT/length_adaptive_runs.jsonl" --result "$OUT/length_adaptive.json" > "$OUT/eval.log" 2>&1
echo "evaluation rc $? at ${SECONDS}s"; grep -v "^seed [0-9]: {" "$OUT/eval.log" | tail -20
