"""Dynamic depth and early exit: gatings that decide per sample how many blocks (and, for DHT,
heads) run, leaving the model at an exit once it is done.

Modules:

* ``settings`` -- the family's pydantic ``Settings`` (torch-free): DHT, depth predictor, confidence exit,
  cascade.
* ``dht`` -- ``gating: dht``: bandit-routed depth and heads under a FLOPs budget (training, state).
* ``dht_paths`` -- DHT's paths: FLOPs of a path, contexts, depth / head choices, head rewards.
* ``dht_eval`` -- DHT at inference: calibration to the budget, prediction, statistics.
* ``predictor`` -- ``gating: depth_predictor``: a structure predictor with RevPC (training).
* ``predictor_eval`` -- the depth predictor at inference: exit rule, calibration, prediction, statistics.
* ``predictor_model`` -- the structure predictor's MLP, RevPC and the depth histogram.
* ``confidence_exit`` -- ``gating: confidence_exit``: DeeBERT's confidence-threshold exit.
* ``cascade`` -- ``gating: cascade``: CascadeBERT's cascade of complete truncated models.
* ``exits`` -- exit losses, distillation, the teacher, and the one early-exit cascade (``run_cascade``).
* ``cascade_graphs`` -- the cascade's segments as CUDA graph replays, and the executor measured per shape.
* ``stopping`` -- ``LinearStopping``: the cascade's stop / continue policy by least squares.
* ``stop_bandit`` -- ``BanditStopping``: the same decision learnt by per-exit LinUCB bandits.

The shared pieces they use (bandits, FLOPs-budget prices, the interfaces) are in
:mod:`archsearch.dynamic`. Importing this package imports nothing else.
"""
