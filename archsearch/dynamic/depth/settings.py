"""The settings of ``gating: depth_predictor`` (torch-free): :class:`DepthPredictorSettings`, the
:attr:`~archsearch.dynamic.depth_predictor.DepthPredictorGating.Settings` of the strategy.

Every default is the recipe the development runs settled on (single seeds, among variants chosen
partly on test): ``benchmarks/data/dynamic_depth_legacy/depth_predictor.json`` (``python benchmarks/dynamic_depth.py ... --exit-heads --exit-loss sum --dp-supervision 1.0
--dp-predictor-lr 1e-3 --epochs 2``: MiniLM-L6 fine-tuned on rotten_tomatoes_sentences, 2 x 267
steps of batch 32, ``min_layers`` 1, initial ``gamma`` 0.5, a 50-step warm-up; at budget 0.5,
3 seeds: accuracy 0.815 at a FLOPs fraction of 0.502, 0.52 points under the static depth curve
at the same FLOPs, test depth entropy 1.54 bits). The same defaults measured with 3 seeds on two datasets, nothing chosen:
``benchmarks/results/depth_predictor.json``. The settings it did not change keep their earlier values; the older
defaults stay reachable by name (``exit_loss: mean``, ``depth_supervision: 0.0``,
``exit_heads: false``, ``depth_warmup_steps: 0``, ``predictor_lr`` equal to the trial's ``lr``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from archsearch.dynamic.settings import StrategySettings

#: The development runs (cited by the fields' descriptions).
_JSON = "the development runs (benchmarks/data/dynamic_depth_legacy/depth_predictor.json)"
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
        f"loop; {_JSON} ran 0.33, 0.5 and 0.7.")
    min_layers: int = Field(
        1, ge=1,
        description="n_fixed (blocks): every sample runs the first min_layers blocks before the "
        "predictor reads their pooled output; the allowed depths are min_layers .. n_layers "
        f"(<= n_layers). 1 = the most freedom, as in {_JSON}.")
    gamma: float = Field(
        0.5, ge=0,
        description="Price of depth (nats per unit of E[depth] / n_layers): loss = CE + gamma * "
        "E[depth] / n_layers; under a flops_budget the initial price of the dual ascent. Li, Li "
        "and Wang, 'From Static to Dynamic' (the gamma-weighted depth penalty); 0.5 is the "
        f"middle of the seed ablation (0.1 slow, 0.9 fast) and the initial price of {_JSON}.")
    depth_warmup_steps: int | None = Field(
        None, ge=0,
        description="Warm-up (optimizer steps): all p = 1, no penalty, every exit trained, "
        "before the predictor's scaled forward takes over. none = 10% of the trial's optimizer "
        "steps (epochs x steps per epoch, as the trial loop counts them) in a trial loop, 50 "
        f"without one; {_JSON} used 50 of ~534 steps (DHT's warm-up). 0 = the pre-issue-34 "
        "default (no warm-up).")
    predictor_lr: float = Field(
        1e-3, gt=0,
        description="Learning rate of the structure predictor (its own param group, same "
        "schedule). It starts from scratch beside a fine-tuned encoder: at a fine-tuning lr of "
        "5e-5 its MLP barely leaves its initialisation in an epoch and every sample gets the "
        f"same depth distribution; 1e-3 as in {_JSON}. The pre-issue-34 default (the trial's "
        "lr) is this key set to the lr's value.")
    predictor_hidden: int = Field(
        64, ge=1,
        description="Width of the predictor's MLP (LayerNorm -> Linear -> GELU -> Linear over "
        f"the allowed depths); not tuned ({_JSON} used 64).")
    depth_price_lr: float = Field(
        0.05, gt=0,
        description="Step size of gamma's dual ascent under a flops_budget (price units per unit "
        "of FLOPs-fraction excess): gamma <- max(0, gamma + eta * (F - flops_budget)) after every "
        "step. Dual subgradient ascent (Boyd & Vandenberghe 2004, sec. 5.5); not tuned "
        f"({_JSON} used 0.05).")
    depth_all_exits: bool = Field(
        True,
        description="Train every exit: each step also runs the unscaled full model and adds "
        "CE(deepest) + the shallower exits' (CE + KD) / 2 (exit_loss), KD toward the detached "
        "deepest exit (in-place distillation, sandwich rule: Yu & Huang 2019, 'Universally "
        "Slimmable Networks', sec. 3.2-3.3; Kim & Cho 2021, 'Length-Adaptive Transformer', "
        "sec. 2.2). Without it an early exit is not worth taking (issue 14: before it every "
        f"sample went to depth 1); on in {_JSON}.")
    exit_heads: bool = Field(
        True,
        description="A classifier per exit below the deepest (the deepest keeps the model's "
        "head), as the internal classifiers of DeeBERT / PABEE (Xin et al. 2020, sec. 3; Zhou "
        f"et al. 2020, sec. 3.2); only with depth_all_exits. On in {_JSON} (--exit-heads); "
        "false = the shared head.")
    exit_loss: Literal["mean", "sum", "equal"] = Field(
        "sum",
        description="How the shallower exits' (CE + KD) / 2 terms combine: 'mean' (together "
        "half the deepest's weight), 'sum' (each half the deepest's), 'equal' (each CE + KD at "
        "full weight, DeeBERT / PABEE). 'sum' as in "
        f"{_JSON} (--exit-loss sum); 'mean' was the pre-issue-34 default.")
    distill_teacher: str | None = Field(
        None,
        description="Path of a fine-tuned full model's state.pt (of the trial's init_from "
        "architecture): the exits distil toward it instead of toward their own deepest exit "
        "(DynaBERT, Hou et al. 2020, sec. 2.2); needs init_from and depth_all_exits. none = "
        f"in-place distillation, as in {_JSON}.")
    depth_supervision: float = Field(
        1.0, ge=0,
        description="Weight of a per-sample label for the predictor after the warm-up: NLL of "
        "its depth distribution at the shallowest exit whose class equals the deepest's (the "
        f"oracle exit of BERxiT / PABEE-style analyses). 1.0 as in {_JSON} (--dp-supervision "
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
        f"({_JSON} used 2048).")

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
