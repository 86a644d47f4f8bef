"""The costs of a trial config known before training: the static model's
(:func:`archsearch.models.costs.static_costs_fn`) as the config's gating changes them
(:meth:`archsearch.dynamic.base.GatingStrategy.known_cost`, through the registry). The one cost
function the searchers and the pre-launch constraint checks share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from archsearch.dynamic import gating_class
from archsearch.models.costs import static_costs_fn


def known_costs_fn(data, fixed: Mapping[str, Any] | None = None) -> Callable[[Mapping[str, Any]], dict]:
    """The costs of a trial config known without training, for the searchers and the
    pre-launch constraint checks.

    ``cost_fn(config)`` merges ``config`` as the trainable does
    (:func:`archsearch.models.config.trial_config`: defaults, then ``fixed``, then ``config``),
    costs its static full-depth model (:func:`archsearch.models.costs.static_costs_fn`) and asks
    the config's gating (:func:`archsearch.dynamic.gating_class`) what it changes
    (:meth:`~archsearch.dynamic.base.GatingStrategy.known_cost`, with the gating's settings as
    the trial resolves them: its defaults where the config is silent). It returns floats:

    * ``flops_per_sample`` (FLOPs per sample, multiply-add = 2): the static model's FLOPs
      averaged over the validation batches exactly as the trainable evaluates them, times the
      gating's FLOPs fraction.

      - ``static``: exactly the metric the trial reports.
      - A gating whose settings declare ``flops_budget`` (``dht``, ``depth_predictor``,
        ``confidence_exit``, ``cascade``), with it set by the config or as the gating's default
        (``dht``: 0.5): ``flops_budget`` x the static value. The inner loop meets the budget on average
        over the validation set (the exit price / threshold is calibrated on up to 2048
        validation rows before each evaluation; tested within +-0.05 of the budget), so the
        trial reports this value within about 0.05 x the static value. A budget below the
        cheapest path (the shallowest allowed exit, plus the depth predictor's own FLOPs; the
        cascade's first cut) cannot be met: such a trial reports more than this.
      - Without a budget (``flops_budget: null`` or not declared: ``length_drop``, budget-free
        ``depth_predictor`` / ``confidence_exit`` at a fixed threshold): the static value, an
        upper bound of what a gated trial executes. A budget-free ``cascade``: the bound of
        every row running every cut and then the full model
        (:meth:`~archsearch.dynamic.depth.cascade.CascadeGating.known_cost`), above the static
        value.
    * ``params_total`` / ``params_trainable`` (counts of scalars): the static model's, plus the
      exit heads the gating adds to the model (``d*C + C`` per exit below the deepest,
      classification only; :func:`archsearch.models.costs.exit_head_params`): exactly what the
      trial reports (``TrialLoop.evaluate`` counts the Transformer, exit heads included), and
      ``cascade``'s cut models (:func:`archsearch.dynamic.depth.cascade.cut_params`: each a
      whole Transformer of ``k`` blocks, embeddings and head included), exactly too. Modules
      a strategy holds itself are counted by neither: the depth predictor's MLP (``2d + d*h + h
      + h*D + D`` scalars, ``h`` = ``predictor_hidden``, ``D`` = allowed depths); DHT's bandit
      statistics and context projection are not parameters. Layer tying is not applied: for
      ``tying`` other than ``none`` both are the untied model's, an upper bound.

    The static costs are cached per model config; the gating's share is applied after the cache,
    so configs that differ only in ``gating`` or its settings share the entry and still get their
    own costs. The function keeps only the scalars it needs (not the dataset), so it stays small
    when pickled (Ray).

    Args:
        data: the run's :class:`archsearch.data.PreparedData`.
        fixed: the space's ``fixed`` values (merged under each config).

    Returns:
        ``cost_fn(config) -> {"flops_per_sample", "params_total", "params_trainable"}`` (a fresh
        dict per call). ``cost_fn`` raises ``ValueError`` for what
        :func:`~archsearch.models.config.model_config` refuses (an invalid architecture or
        checkpoint), an unknown ``gating``, and a value the gating's settings refuse (e.g. a
        ``flops_budget`` outside ``(0, 1]``; the message names the key), as the trial would.
    """
    static = static_costs_fn(data, fixed)

    def cost_fn(config: Mapping[str, Any]) -> dict[str, float]:
        cfg, mcfg, costs = static(config)
        fraction, extra = gating_class(str(cfg["gating"])).known_cost(cfg, mcfg)
        return {"flops_per_sample": costs["flops_per_sample"] * fraction,
                "params_total": costs["params_total"] + extra,
                "params_trainable": costs["params_trainable"] + extra}

    return cost_fn
