#!/bin/bash
# One device call for issue 35 (a GPU session's whole check): CUDA tests of the cascade paths, then
# python -m benchmarks.gpu.gpu run. Prepare here first (the project root, .venv built):
#   echo /.devcarry/ >> .git/info/exclude; bash ../shared/tools/device_prep.sh .devcarry
#   rm .devcarry/whl/{sqlalchemy,alembic,mako,optuna,colorlog}*   # the carry limit (64 MiB with the tree)
#   .venv/bin/python benchmarks/gpu/device_pack.py pack .devcarry/minilm .devcarry/minilm.packed \
#     && rm -r .devcarry/minilm && mv .devcarry/minilm.packed .devcarry/minilm  # 34.5 -> 29.8 MB, lossless
#   git rev-parse HEAD > .devcarry/commit                           # the commit the rows record
# then run it there with carry [".devcarry"]: bash benchmarks/gpu/gpu_device.sh
# Env: TESTS=0 skips the tests; BOX = seconds of this script after which gpu.gpu starts no new row
# (default 420); BUDGET = its hard limit (565); RESUME=1 resumes from .devcarry/gpu_rows.jsonl
# (default: fresh rows, so the timed rows run with this commit's executor). Everything comes back
# under $OUT: tests.log, gpu_rows.jsonl, gpu.json, gpu.log; merge calls with `python -m benchmarks.gpu.gpu analyze --call ROWS:MACHINE ...`.
set -u
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
carry=.devcarry
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $carry/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
if [ -f $carry/minilm/model.planes.json ]; then  # packed by benchmarks/gpu/device_pack.py
  python3 benchmarks/gpu/device_pack.py unpack $carry/minilm /tmp/minilm || exit 4
else
  python3 $carry/dequant.py $carry/minilm /tmp/minilm || exit 4
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
[ "${RESUME:-0}" = 1 ] && [ -f $carry/gpu_rows.jsonl ] && cp $carry/gpu_rows.jsonl "$OUT/gpu_rows.jsonl"
if [ "${TESTS:-1}" = 1 ]; then
  ARCHSEARCH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 \
    tests/test_cascade_graphs.py tests/test_confidence_exit.py tests/test_dht.py tests/test_depth_predictor.py \
    tests/test_devices.py tests/test_gating_contract.py tests/test_exit_heads.py -m "not slow and not ray" \
    > "$OUT/tests.log" 2>&1
  echo "tests rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -25
fi
ARCHSEARCH_COMMIT=$(cat $carry/commit) timeout $((${BUDGET:-565} - SECONDS)) python3 -m benchmarks.gpu.gpu run \
  --device cuda --ckpt /tmp/minilm --rows "$OUT/gpu_rows.jsonl" --out "$OUT/gpu.json" \
  --max-seconds $((${BOX:-420} - SECONDS)) --threads 4 --workers 6 > "$OUT/gpu.log" 2>&1
echo "gpu.gpu rc $? at ${SECONDS}s"; grep -v '^ \|^{\|^}' "$OUT/gpu.log" | tail -40
python3 - <<'PY'
import json, os
try:
    s = json.load(open(os.environ["OUT"] + "/gpu.json"))["summary"]
    print(json.dumps({k: v for k, v in s.items() if not isinstance(v, dict)}))
except Exception as e:
    print("no summary:", e)
PY
