"""The settings of the depth family's gatings (torch-free), each the ``Settings`` of its strategy:

* :class:`DHTSettings` -- ``gating: dht`` (:class:`~archsearch.dynamic.depth.dht.DHTGating`);
  every default is the best measured (:data:`_MEASURED`).
* :class:`DepthPredictorSettings` -- ``gating: depth_predictor``
  (:class:`~archsearch.dynamic.depth.predictor.DepthPredictorGating`); its defaults below.
* :class:`ConfidenceExitSettings` -- ``gating: confidence_exit``
  (:class:`~archsearch.dynamic.depth.confidence_exit.ConfidenceExitGating`).
* :class:`CascadeSettings` -- ``gating: cascade``
  (:class:`~archsearch.dynamic.depth.cascade.CascadeGating`).

``gating: depth_predictor``: every default is the recipe the development runs settled on (single
seeds, among variants chosen partly on test):
``benchmarks/depth/runs/dynamic_depth_legacy/depth_predictor.json`` (``python -m benchmarks.depth.dynamic_depth
... --exit-heads --exit-loss sum --dp-supervision 1.0 --dp-predictor-lr 1e-3 --epochs 2``:
MiniLM-L6 fine-tuned on rotten_tomatoes_sentences, 2 x 267 steps of batch 32, ``min_layers`` 1,
initial ``gamma`` 0.5, a 50-step warm-up; at budget 0.5, 3 seeds: accuracy 0.815 at a FLOPs
fraction of 0.502, 0.52 points under the static depth curve at the same FLOPs, test depth
entropy 1.54 bits). The same defaults measured with 3 seeds on two datasets, nothing chosen:
``benchmarks/depth/results/depth_predictor.json``. The settings it did not change keep their earlier
values; the older defaults stay reachable by name (``exit_loss: mean``, ``depth_supervision:
0.0``, ``exit_heads: false``, ``depth_warmup_steps: 0``, ``predictor_lr`` equal to the trial's
``lr``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from archsearch.dynamic.settings import StrategySettings

#: The development runs (cited by the fields' descriptions).
_DP_JSON = "the development runs (benchmarks/depth/runs/dynamic_depth_legacy/depth_predictor.json)"
#: The default warm-up when ``depth_warmup_steps`` is ``None``: this percentage of the trial's
#: optimizer steps, or :data:`WARMUP_FALLBACK_STEPS` steps outside a trial loop.
WARMUP_PERCENT = 10
WARMUP_FALLBACK_STEPS = 50


class DepthPredictorSettings(StrategySettings):
    """The knobs of ``gating: depth_predictor`` (module docstring: the defaults are the
    reported recipe). ``min_layers`` must also be at most the model's ``n_layers`` (checked by
    the strategy, which knows the model).

    Raises:
        ValueError (through :meth:`~archsearch.dynamic.settings.StrategySettings.from_config`):
            a value out of range or of the wrong type, an unknown key (``extra="forbid"``),
            ``depth_supervision > 0`` or ``distill_teacher`` set explicitly together with
            ``depth_all_exits: false`` (both train the exits); the message names the key.
    """

    flops_budget: float | None = Field(
        None, gt=0, le=1,
        description="FLOPs budget: mean executed FLOPs per sample as a fraction of the full "
        "model's, in (0, 1]; none = no budget (gamma stays fixed, exit at the median). Under a "
        "budget gamma follows it by dual ascent during training and the exit threshold is "
        f"calibrated on validation rows before each evaluation (issue 14). Searched by the outer "
        f"loop; {_DP_JSON} ran 0.33, 0.5 and 0.7.")
    min_layers: int = Field(
        1, ge=1,
        description="n_fixed (blocks): every sample runs the first min_layers blocks before the "
        "predictor reads their pooled output; the allowed depths are min_layers .. n_layers "
        f"(<= n_layers). 1 = the most freedom, as in {_DP_JSON}.")
    gamma: float = Field(
        0.5, ge=0,
        description="Price of depth (nats per unit of E[depth] / n_layers): loss = CE + gamma * "
        "E[depth] / n_layers; under a flops_budget the initial price of the dual ascent. Li, Li "
        "and Wang, 'From Static to Dynamic' (the gamma-weighted depth penalty); 0.5 is the "
        f"middle of the seed ablation (0.1 slow, 0.9 fast) and the initial price of {_DP_JSON}.")
    depth_warmup_steps: int | None = Field(
        None, ge=0,
        description="Warm-up (optimizer steps): all p = 1, no penalty, every exit trained, "
        "before the predictor's scaled forward takes over. none = 10% of the trial's optimizer "
        "steps (epochs x steps per epoch, as the trial loop counts them) in a trial loop, 50 "
        f"without one; {_DP_JSON} used 50 of ~534 steps (DHT's warm-up). 0 = the pre-issue-34 "
        "default (no warm-up).")
    predictor_lr: float = Field(
        1e-3, gt=0,
        description="Learning rate of the structure predictor (its own param group, same "
        "schedule). It starts from scratch beside a fine-tuned encoder: at a fine-tuning lr of "
        "5e-5 its MLP barely leaves its initialisation in an epoch and every sample gets the "
        f"same depth distribution; 1e-3 as in {_DP_JSON}. The pre-issue-34 default (the trial's "
        "lr) is this key set to the lr's value.")
    predictor_hidden: int = Field(
        64, ge=1,
        description="Width of the predictor's MLP (LayerNorm -> Linear -> GELU -> Linear over "
        f"the allowed depths); not tuned ({_DP_JSON} used 64).")
    depth_price_lr: float = Field(
        0.05, gt=0,
        description="Step size of gamma's dual ascent under a flops_budget (price units per unit "
        "of FLOPs-fraction excess): gamma <- max(0, gamma + eta * (F - flops_budget)) after every "
        "step. Dual subgradient ascent (Boyd & Vandenberghe 2004, sec. 5.5); not tuned "
        f"({_DP_JSON} used 0.05).")
    depth_all_exits: bool = Field(
        True,
        description="Train every exit: each step also runs the unscaled full model and adds "
        "CE(deepest) + the shallower exits' (CE + KD) / 2 (exit_loss), KD toward the detached "
        "deepest exit (in-place distillation, sandwich rule: Yu & Huang 2019, 'Universally "
        "Slimmable Networks', sec. 3.2-3.3; Kim & Cho 2021, 'Length-Adaptive Transformer', "
        "sec. 2.2). Without it an early exit is not worth taking (issue 14: before it every "
        f"sample went to depth 1); on in {_DP_JSON}.")
    exit_heads: bool = Field(
        True,
        description="A classifier per exit below the deepest (the deepest keeps the model's "
        "head), as the internal classifiers of DeeBERT / PABEE (Xin et al. 2020, sec. 3; Zhou "
        f"et al. 2020, sec. 3.2); only with depth_all_exits. On in {_DP_JSON} (--exit-heads); "
        "false = the shared head.")
    exit_loss: Literal["mean", "sum", "equal"] = Field(
        "sum",
        description="How the shallower exits' (CE + KD) / 2 terms combine: 'mean' (together "
        "half the deepest's weight), 'sum' (each half the deepest's), 'equal' (each CE + KD at "
        "full weight, DeeBERT / PABEE). 'sum' as in "
        f"{_DP_JSON} (--exit-loss sum); 'mean' was the pre-issue-34 default.")
    distill_teacher: str | None = Field(
        None,
        description="Path of a fine-tuned full model's state.pt (of the trial's init_from "
        "architecture): the exits distil toward it instead of toward their own deepest exit "
        "(DynaBERT, Hou et al. 2020, sec. 2.2); needs init_from and depth_all_exits. none = "
        f"in-place distillation, as in {_DP_JSON}.")
    depth_supervision: float = Field(
        1.0, ge=0,
        description="Weight of a per-sample label for the predictor after the warm-up: NLL of "
        "its depth distribution at the shallowest exit whose class equals the deepest's (the "
        f"oracle exit of BERxiT / PABEE-style analyses). 1.0 as in {_DP_JSON} (--dp-supervision "
        "1.0); 0 = none (the pre-issue-34 default). Needs depth_all_exits (ignored without it "
        "unless set explicitly, which raises).")
    exit_threshold: float = Field(
        0.5, gt=0, le=1,
        description="Exit rule without a flops_budget: a sample runs block n_fixed + k while "
        "P(depth >= n_fixed + k) >= exit_threshold (RevPC; 0.5 = the median of its predicted "
        "depth distribution; the arg-max rule used before issue 14 sent every sample to depth "
        "1). Under a budget the calibrated threshold replaces it.")
    depth_calibration_rows: int = Field(
        2048, ge=1,
        description="Validation rows the exit threshold is calibrated on before each evaluation "
        "under a flops_budget (bisection on the FLOPs fraction); not tuned "
        f"({_DP_JSON} used 2048).")

    @model_validator(mode="after")
    def _exits_trained(self) -> "DepthPredictorSettings":
        if not self.depth_all_exits:
            if "depth_supervision" in self.model_fields_set and self.depth_supervision > 0:
                raise ValueError(f"depth_supervision: {self.depth_supervision} > 0 needs "
                                 "depth_all_exits (the label comes from the trained exits)")
            if self.distill_teacher:
                raise ValueError("distill_teacher: needs depth_all_exits (the teacher trains the exits)")
        return self

    @property
    def supervision(self) -> float:
        """The ``depth_supervision`` in effect: 0 without ``depth_all_exits``."""
        return self.depth_supervision if self.depth_all_exits else 0.0

    def warmup_steps(self, total_steps: int | None) -> int:
        """The warm-up in optimizer steps: ``depth_warmup_steps`` when set, else
        :data:`WARMUP_PERCENT` % of ``total_steps`` (the trial's optimizer steps, rounded down)
        or :data:`WARMUP_FALLBACK_STEPS` when they are unknown (``None``)."""
        if self.depth_warmup_steps is not None:
            return self.depth_warmup_steps
        return WARMUP_FALLBACK_STEPS if total_steps is None else total_steps * WARMUP_PERCENT // 100


#: Where the defaults come from: the variant the development runs settled on
#: (benchmarks/depth/runs/dynamic_depth_legacy/dht.json: MiniLM-L6 on Rotten Tomatoes, 2 epochs, partly
#: chosen on test), measured with 3 seeds on two datasets in benchmarks/depth/results/dht.json and kept
#: by the validation-only comparisons there and in stop_policies.json, dht_recipe.json,
#: stop_bandit.json and head_gating.json.
_MEASURED = "the variant of benchmarks/depth/results/dht.json"


class DHTSettings(StrategySettings):
    """Settings of ``gating: dht``; every default is the best measured (:data:`_MEASURED`).

    Training length is the trial's (``epochs``), not a setting here, but it is the recipe that
    mattered most for the exits: chosen on validation among equal exit-loss weights and a third
    epoch (``benchmarks/depth/results/dht_recipe.json``, MiniLM-L6 on two datasets), 3 epochs brought
    exits 3 and 6 within half a point of models fine-tuned at those depths for 2 (exit 2 stays
    0.7-2.1 points below). Give ``gating: dht`` trials 3 epochs where static ones get 2."""

    flops_budget: float | None = Field(0.5, gt=0, le=1, description=(
        "Fraction of the full model's FLOPs per sample that inference may spend; the price is "
        "calibrated on validation to meet it. A trial always has one: `null` in a space or "
        "trial config means the default, as for every setting (an inactive conditional param); "
        "only a DHTGating built in Python can run without a budget, at the price `dht_lambda`. "
        "Default 0.5: the headline budget of dht.json."))
    dht_lambda: float = Field(0.5, ge=0, description=(
        "Initial price of a FLOPs fraction (reward units per unit fraction); the fixed price "
        "without `flops_budget`."))
    n_fixed: int = Field(1, ge=0, description="Blocks every sample runs before the first decision.")
    min_layers: int | None = Field(None, ge=1, description=(
        "Shallowest exit (blocks); None: `n_fixed`. Clamped into [n_fixed, max_layers]."))
    max_layers: int | None = Field(None, ge=1, description=(
        "Deepest exit (blocks); None: the model's `n_layers`. Clamped to `n_layers`."))
    min_heads: int | None = Field(None, ge=1, description=(
        "Fewest heads a gated block may keep; None: all heads (head gating off). Measured: "
        "on short inputs head gating cost accuracy at equal FLOPs (the development runs ran `min_heads: 12` "
        "= all of MiniLM's); on long ones (20 Newsgroups, 128 tokens, head_gating.json) it kept "
        "10.8 of 12 heads at 0.5x and was level with depth-only (-0.35 points, -1.35 to 0.65). "
        "`1` is the paper's full head gating (arXiv 2312.03038 §3.3)."))
    dht_warmup_steps: int | None = Field(None, ge=0, description=(
        "Optimizer steps of full-depth training before the bandit may take over; None: 10% of "
        "the trial's steps (the development runs: 50 of 534; the default space: 15 of 150), or 100 "
        "outside a trial loop."))
    dht_warmup_max_steps: int | None = Field(None, ge=0, description=(
        "Take-over at the latest after this many steps; None: 10 x the warm-up."))
    dht_exits_from_step: int = Field(0, ge=0, description=(
        "The shallower exits join the loss from this step on (DeeBERT's two stages, Xin et al. "
        "2020 §3.2, without freezing); 0: from the start, as measured."))
    dht_exit_schedule: Literal["joint", "alternating"] = Field("joint", description=(
        "`joint`: every step trains every exit (measured); `alternating`: BERxiT's alternating "
        "fine-tuning (Xin et al., EACL 2021, sec. 3.1): odd steps the deepest exit's loss alone, "
        "even steps the joint loss, so the last layer is fine-tuned as a plain model half the "
        "time. Measured on seed 0 of both datasets (protocols/dht_recipe_v2.json, printed by "
        "`python -m benchmarks.depth.dht_seeded run --select-v2`): it lifts the deepest exit but "
        "costs exits 2 and 3 more than that protocol allows, so `joint` stays the default."))
    exit_heads: bool = Field(True, description=(
        "A classifier per exit (True, measured better) or one head shared by every exit."))
    exit_loss: Literal["mean", "sum", "equal"] = Field("sum", description=(
        "How the shallower exits' `(CE + KD) / 2` terms combine: `sum` (measured), `mean`, or "
        "`equal` (`CE + KD` each, DeeBERT / PABEE's equal weights)."))
    dht_reward: Literal["ce", "prob"] = Field("prob", description=(
        "Bandit quality of an exit: `prob` = exp(-CE), the probability of the true class "
        "(measured); `ce` = -CE / running mean CE."))
    dht_exit_context: bool = Field(True, description=(
        "Add the first exit's max probability and entropy to the routing context (DeeBERT's "
        "confidence signal). Always on with `dht_routing: cascade`."))
    dht_routing: Literal["once", "cascade"] | None = Field(None, description=(
        "`cascade`: stop / continue at every exit (measured best); `once`: LinUCB picks each "
        "sample's depth after block `n_fixed` (the paper's). None: `cascade` for "
        "classification, `once` for `task: lm` (an LM's exit head is vocabulary-sized)."))
    dht_stop_fit: Literal["train", "validation"] = Field("validation", description=(
        "Cascade: fit the stop policy on the training exits (`train`) or refit it on the "
        "calibration rows, label-free (`validation`, measured)."))
    dht_stop_rule: Literal["regression", "tuned", "confidence", "bandit"] = Field("tuned", description=(
        "Cascade: stop when the regression's advantage beats 0 (`regression`), beats a per-exit "
        "threshold found by direct search (`tuned`, measured), or per-exit thresholds on the "
        "exit's max probability (`confidence`); or a per-exit {stop, continue} LinUCB bandit "
        "learnt with exploration (`dht_stop_alpha`) from the arms it plays only, greedy at "
        "inference (`bandit`)."))
    dht_stop_quality: Literal["prob", "match"] = Field("match", description=(
        "Cascade with `dht_stop_fit: validation`: a row's quality at an exit is 1 if its class "
        "is the deepest exit's (`match`, measured) or that class's probability (`prob`)."))
    dht_stop_context: Literal["exit", "trajectory"] = Field("trajectory", description=(
        "Cascade: decide from the exit's max probability, entropy and agreement with the last "
        "exits (`trajectory`, measured; PABEE's patience, Zhou et al. 2020 §3) or from the "
        "projected hidden state and the exit's confidence (`exit`)."))
    dht_stop_refit_every: int = Field(8, ge=1, description=(
        "Cascade: refit the training stop policy every this many steps (the window keeps every "
        "batch); 1 refits after each step, as the development runs did. The fit (a least-squares "
        "solve per exit over 2048 rows) took 10% of a GPU trial's training at 1; inference "
        "refits on validation anyway (`dht_stop_fit: validation`)."))
    dht_routed_forward: Literal["separate", "shared"] = Field("shared", description=(
        "After the take-over, a routed sample's training loss at its exit reads the deepest "
        "path's own exit logits for that sample where its group computes every head (`shared`: "
        "the same function, one dropout draw, no second forward) or a second forward of its "
        "group through the gated blocks (`separate`, how dht.json's rows were trained). Chosen by "
        "gpu.json's pre-registered rule on validation: -0.22 points (3 seeds) at 1.23x the full "
        "model's training time against 1.98x on one H200."))
    dht_epsilon: float = Field(0.05, ge=0, le=1, description=(
        "Exploration floor: fraction of routed training samples sent to a random depth."))
    dht_price_lr: float = Field(0.05, gt=0, description="Dual-ascent step of the price per step.")
    dht_calibration_rows: int = Field(2048, ge=1, description=(
        "Validation rows the price (and the cascade's stop policy) is calibrated on."))
    dht_alpha: float = Field(0.3, ge=0, description=(
        "LinUCB exploration scale of the per-sample depth router (Li et al. 2010, Alg. 1)."))
    dht_stop_alpha: float = Field(5.0, ge=0, description=(
        "LinUCB exploration scale of `dht_stop_rule: bandit` (Li et al. 2010, Alg. 1). Chosen on "
        "validation from {0.3, 1, 2.4, 5} (stop_bandit_fair.json): at 0.3 the bandit never played "
        "continue at exit 1; at 5 it does on 57-76% of the rows while learning."))
    dht_ucb_c: float = Field(0.3, ge=0, description="UCB1 exploration scale (rewards are O(1)).")
    dht_decay: float = Field(0.99, gt=0, le=1, description=(
        "Forgetting factor of every bandit per update (the model keeps training: rewards drift)."))
    dht_ema: float = Field(0.95, ge=0, lt=1, description="Smoothing of the running loss and head baselines.")
    distill_teacher: str | None = Field(None, description=(
        "A fine-tuned full model's `state.pt`: every exit distils toward it instead of the "
        "deepest exit (DynaBERT, Hou et al. 2020 §2.2); measured +0.19 points, inside the noise."))

    @field_validator("dht_routing")
    @classmethod
    def _cascade_is_for_classification(cls, v, info: ValidationInfo):
        if v == "cascade" and (info.context or {}).get("task") == "lm":
            raise ValueError("cascade is for classification (task: lm reads a vocabulary-sized exit head at every exit)")
        return v


#: The development runs (cited by the fields' descriptions of ``gating: confidence_exit``).
_CE_JSON = "the development runs (benchmarks/depth/runs/dynamic_depth_legacy/dht.json)"


class ConfidenceExitSettings(StrategySettings):
    """The knobs of ``gating: confidence_exit``. ``min_layers`` must also be at most the model's
    ``n_layers`` (checked by the strategy, which knows the model)."""

    flops_budget: float | None = Field(
        None, gt=0, le=1,
        description="FLOPs budget: mean executed FLOPs per sample as a fraction of the full "
        "model's, in (0, 1]; the exit threshold is calibrated on validation rows (no labels) "
        "before each evaluation so that the fraction lands on it. none = the fixed "
        f"exit_threshold. {_CE_JSON} measured this baseline at 0.33, 0.5 and 0.7.")
    exit_threshold: float = Field(
        0.9, ge=0, le=1,
        description="Without a flops_budget: a sample leaves at the first exit whose max softmax "
        "probability is >= this (DeeBERT's confidence rule, Xin et al. 2020, sec. 3, on the max "
        "probability instead of the entropy). 0 = everyone leaves at the first exit, 1 = only "
        "certain exits; 0.9 is not tuned.")
    min_layers: int = Field(
        1, ge=1,
        description="Depth of the shallowest exit (blocks); exits after every block min_layers .. "
        "n_layers (<= n_layers). 1 = an off-ramp after every layer, as in DeeBERT and "
        f"{_CE_JSON}.")
    exit_heads: bool = Field(
        True,
        description="A classifier per exit below the deepest (DeeBERT's off-ramps, Xin et al. "
        "2020, sec. 3; PABEE's internal classifiers, Zhou et al. 2020, sec. 3.2); a model that "
        f"already has them keeps them. On in {_CE_JSON} (--exit-heads); false = the shared head.")
    exit_loss: Literal["mean", "sum", "equal"] = Field(
        "sum",
        description="How the shallower exits' (CE + KD) / 2 terms combine: 'mean' (together "
        "half the deepest's weight), 'sum' (each half the deepest's), 'equal' (each CE + KD at "
        f"full weight, DeeBERT / PABEE). 'sum' as in {_CE_JSON} (--exit-loss sum).")
    confidence_calibration_rows: int = Field(
        2048, ge=1,
        description="Validation rows the threshold is calibrated on under a flops_budget (the "
        f"first evaluation batches holding at least this many); not tuned ({_CE_JSON} used 2048).")


#: A cut's depth (blocks), >= 1; below the model's ``n_layers`` (checked by the strategy, which
#: knows the model).
CutDepth = Annotated[int, Field(ge=1)]


class CascadeSettings(StrategySettings):
    """The knobs of ``gating: cascade``. Every depth of ``cascade_depths`` must also be below the
    model's ``n_layers`` (checked by the strategy, which knows the model).

    Raises:
        ValueError (through :meth:`~archsearch.dynamic.settings.StrategySettings.from_config`):
            a value out of range or of the wrong type, an unknown key, ``cascade_depths`` not
            strictly ascending; the message names the key.
    """

    flops_budget: float | None = Field(
        None, gt=0, le=1,
        description="FLOPs budget: mean executed FLOPs per sample (every stage a row ran, the "
        "cuts it left and the model that answered) as a fraction of the full model's, in (0, 1]; "
        "the threshold is calibrated on validation rows (no labels) before each evaluation so "
        "that the fraction lands on it (the closest reachable fraction when it cannot: never "
        "below the first cut's own). none = the fixed exit_threshold. Not measured here.")
    exit_threshold: float = Field(
        0.9, ge=0, le=1,
        description="Without a flops_budget: a row is answered by the first cut whose max softmax "
        "probability is >= this, else by the full model (CascadeBERT's confidence rule, Li et al. "
        "2021, sec. 3). 0 = the first cut answers every row; 0.9 is not tuned.")
    cascade_depths: Annotated[tuple[CutDepth, ...], Field(min_length=1)] | None = Field(
        None, validate_default=True,
        description="Depths (blocks) of the complete truncated models run before the full model, "
        "strictly ascending, each in 1 .. n_layers - 1: cut k is the first k blocks of the "
        "trial's model with its own copy of the embeddings, final LayerNorm and head (its own "
        "parameters, fine-tuned beside the full model from the same initialisation). An int k "
        "is the one cut [k] (what a search space, whose values are scalars, can set). none = the "
        "cuts at a third and at half of n_layers (rounded down, at least 1): 2 and 3 blocks of a "
        "6-block model, the structure chosen on validation at 0.5x FLOPs among 2->6, 3->6 and "
        "2->3->6 on both datasets of benchmarks/depth/results/dht.json "
        "(protocols/dht_cascade.json); 1 on 2- and 3-block models.")
    cascade_calibration_rows: int = Field(
        2048, ge=1,
        description="Validation rows the threshold is calibrated on under a flops_budget (the "
        "first evaluation batches holding at least this many); as confidence_calibration_rows, "
        "not tuned.")

    @field_validator("cascade_depths", mode="before")
    @classmethod
    def _one_cut_as_an_int(cls, v):
        return [v] if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("cascade_depths")
    @classmethod
    def _ascending(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"must be strictly ascending (each cut deeper than the last), got {list(v)}")
        return v
