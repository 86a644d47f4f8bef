"""The settings of the length family (torch-free): :class:`LengthDropSettings`, the ``Settings``
of ``gating: length_drop`` (:class:`~archsearch.dynamic.length.drop.LengthDropGating`), and the
types its fields use (:data:`DropRule`, :data:`Fraction`).

Source of the defaults: Kim & Cho, "Length-Adaptive Transformer", ACL 2021 (the paper's and its
code's values) and the reported recipe, ``benchmarks/length/results/length_adaptive.json``; each
field's ``description`` says which.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from archsearch.dynamic.settings import StrategySettings

#: Which tokens an encoder block keeps (:func:`archsearch.dynamic.length.forward._drop_block`): the
#: type of the setting ``length_drop_rule``; its values are
#: :data:`archsearch.dynamic.length.forward.DROP_RULES`.
DropRule = Literal["significance", "prefix"]
#: A FLOPs fraction of the full model, in ``(0, 1]``.
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]


class LengthDropSettings(StrategySettings):
    """The knobs of ``gating: length_drop`` (:attr:`archsearch.dynamic.length.drop.LengthDropGating.Settings`)."""

    length_drop_p: float = Field(0.36, ge=0.0, lt=1.0, description=(
        "LengthDrop bound p, a fraction of a block's input tokens in [0, 1): a random sub-model "
        "keeps l_i ~ U{ceil((1 - p) l_{i-1}), ..., l_{i-1}} tokens after block i, the smallest "
        "sub-model ceil((1 - p) l_{i-1}), and the search never goes below that smallest one "
        "(Kim & Cho 2021, sec. 3.1). 0.36: the reported recipe "
        "(benchmarks/length/results/length_adaptive.json, MiniLM-L6), 1 - 0.8^(12/6): the paper's "
        "p = 0.2 over BERT-base's 12 layers (its code's --length_drop_ratio_bound 0.2) made to "
        "reach the same smallest sub-model (6.9 % of the tokens) over 6 layers; p = 0.2 there "
        "would leave nothing trained under 0.52x FLOPs. For L layers: 1 - 0.8^(12/L)."))
    layer_drop_p: float = Field(0.2, ge=0.0, lt=1.0, description=(
        "LayerDrop probability in [0, 1): each block of a random sandwich sub-model is skipped "
        "with this probability (the full and smallest sub-models run every block). 0.2: the "
        "paper's (Kim & Cho 2021, sec. 3.1, after Fan et al. 2020; its code's "
        "--layer_dropout_prob 0.2) and the reported recipe's."))
    length_drop_rule: DropRule = Field("significance", description=(
        "Which tokens an encoder block keeps: 'significance', the most attended ones (attention "
        "received, summed over heads and real queries: PoWER-BERT's score, Kim & Cho 2021, "
        "sec. 3.1); 'prefix', the first ones in the current order (truncation inside the "
        "network, after the block's attention has read every token: an ablation). "
        "Classification only: the causal LM always keeps evenly spaced positions (a "
        "content-based choice would leak the future), so 'prefix' is refused for task lm. "
        "'significance': the paper's and the reported recipe's."))
    evolution_iterations: int = Field(30, ge=0, description=(
        "Iterations of the evolutionary search finalize() runs after training (0: the initial "
        "population of 10 genes only); each adds evolution_mutations + evolution_crossovers "
        "new length configurations. 30: the paper's (Kim & Cho 2021, sec. 4; its code's "
        "--evo_iter 30). The reported benchmark searched 3 x (6 + 6) to fit 2 cores (its own "
        "search, outside this gating); small spaces set fewer (search_spaces/length_drop.yaml)."))
    evolution_mutations: int = Field(30, ge=0, description=(
        "New configurations per search iteration by mutation of a Pareto-front parent (each "
        "layer resampled with probability 0.5 between its neighbours, never below the smallest "
        "trained sub-model). 30: the paper's (sec. 4; --mutation_size 30)."))
    evolution_crossovers: int = Field(30, ge=0, description=(
        "New configurations per search iteration by crossover of two Pareto-front parents "
        "(ceiling of their element-wise mean). 30: the paper's (sec. 4; --crossover_size 30)."))
    evolution_val_samples: int = Field(1024, ge=1, description=(
        "Validation samples each candidate configuration is evaluated on, the same subset for "
        "all (classification: sentences drawn at random, seeded; LM: the first blocks of "
        "max_len tokens). 1024: ours, to bound a search's cost (the paper evaluates on the "
        "whole dev set; the reported benchmark on its whole 2,000-document validation split). "
        "The search's Pareto set is then measured on the whole validation split, the figures "
        "the anytime curve and budget_configs report."))
    length_budgets: Annotated[tuple[Fraction, ...], Field(min_length=1)] | None = Field(None, description=(
        "FLOPs fractions of the full model, each in (0, 1], e.g. [0.5, 0.35]: finalize() adds "
        "budget_configs, per fraction the most accurate searched configuration whose FLOPs on "
        "the validation subset fit that fraction of the full model's (null when none does), "
        "with its metric and FLOPs on the whole validation split. None: the anytime curve only. The paper reports whole accuracy-FLOPs curves; [0.5, "
        "0.35] are the reported benchmark's claim, not a recipe, so no default."))

    @field_validator("length_drop_rule")
    @classmethod
    def _rule_fits_task(cls, v: str, info) -> str:
        if v == "prefix" and (info.context or {}).get("task") == "lm":
            raise ValueError("'prefix' is for classification; the LM always keeps evenly spaced "
                             "positions (a content-based choice would leak the future)")
        return v
