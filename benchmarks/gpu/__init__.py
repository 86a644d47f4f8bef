"""GPU: do the per-sample gatings' FLOPs savings hold on a GPU, at what accuracy and training cost,
and what does the cost model say about time?

Claims:

* ``gpu.py`` (issue 35, ``protocols/gpu.json``): MiniLM-L6 on rotten_tomatoes_sentences, every
  gating against the static model on one GPU: test accuracy (``rt_sentences:test``), wall-clock
  ratios at batch 1 / 32 / 256, training-time ratios, bf16 against fp32 (``results/gpu.json``,
  merged from the device calls in ``runs/gpu_calls``).
* ``train_ops.py`` (``protocols/train_ops.json``): the gatings' training steps dispatch few more
  operators than the static model's, the proxy of the launch-bound GPU training time
  (``results/train_ops.json``, rows in ``runs/train_ops_runs.jsonl``).
* ``model_speed.py``: the analytic cost model matches FlopCounterMode, and fewer FLOPs are less
  wall-clock on this machine (``results/model_speed.json``; a measurement, nothing to analyze).
* ``device_pack.py``: the lossless packing of the device carry's MiniLM copy (run by path).

    python -m benchmarks.gpu.gpu analyze | check        # gpu.json from the committed calls' rows
    bash benchmarks/gpu/gpu_device.sh                    # one device call (see its head)
    python -m benchmarks.gpu.train_ops analyze | check   # train_ops.json from the committed rows
    python -m benchmarks.gpu.train_ops run --regression-check
    python -m benchmarks.gpu.model_speed run
"""
