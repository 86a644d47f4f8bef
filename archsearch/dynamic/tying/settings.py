"""The settings of the tying controllers (torch-free): ``tying: all``, ``every_k``, ``rl``,
``paper``, ``switch`` and ``merge``.

The controllers (:mod:`archsearch.dynamic.tying.controllers`, :mod:`archsearch.dynamic.tying.rl`)
declare these as their ``Settings``; a field's name is its trial-config key, and its
``description`` gives the unit, the default's reason and the source. Every default here is the
value ``benchmarks/tying/tying.py`` ran (``benchmarks/tying/results/tying.json``); the design is
docs/design.md, "Dynamic layer tying".
"""

from __future__ import annotations

from pydantic import Field

from archsearch.dynamic.settings import StrategySettings


class AllTyingSettings(StrategySettings):
    """``tying: all`` has no knobs: every block shares block 0's weights (ALBERT-style)."""


class EveryKTyingSettings(StrategySettings):
    """Knobs of ``tying: every_k`` (:class:`archsearch.dynamic.tying.controllers.EveryKTying`)."""

    tying_k: int = Field(2, ge=1, description=(
        "Blocks per shared group (count): blocks k*m .. k*m+k-1 share block k*m's weights for the "
        "whole run, the 'sequence' pattern of Takase & Kiyono 2021, \"Lessons on Parameter "
        "Sharing across Layers in Transformers\"; 1 unties every block, >= n_layers ties them all. "
        "Default 2: in benchmarks/tying/tying.py's data-limited regime (125k characters, the untied "
        "model overfits) every_2 had the best validation perplexity, 0.21 below untied at 0.51x "
        "the parameters (k = 4: 0.19 below at 0.27x); with ample data (issue 16, 4.5M "
        "characters) tying cost perplexity: 1.006x untied for k = 2, 1.049x for k = 4."))


class SwitchTyingSettings(StrategySettings):
    """Knobs of ``tying: switch`` (:class:`archsearch.dynamic.tying.controllers.SwitchTying`):
    train untied while a held-out loss improves, then tie to the ``every_k`` map for the rest of
    the run."""

    tying_k: int = Field(4, ge=1, description=(
        "Blocks per shared group after the switch (count): the every_k map of tying: every_k "
        "(blocks k*m .. k*m+k-1 share block k*m's weights, taken from block k*m at the switch). "
        "Default 4: chosen on benchmarks/tying/tying.py's validation curves (seeds 0-1: switching to "
        "every_4 at the untied model's validation minimum gained 0.12 and 0.28 perplexity over "
        "every_4 from step 0, to every_2 0.00 and 0.04); over 3 seeds that hindsight switch "
        "averages -0.06 (every_4) and +0.07 (every_2), and tying: switch itself +0.001 against "
        "the best fixed map of its size (-0.12, -0.11, +0.24): no gain shown."))
    tying_check_every: int = Field(100, ge=1, description=(
        "Optimizer steps between two held-out checks (the mean loss on tying_split). Default "
        "100: benchmarks/tying/tying.py's validation-curve spacing (30 points over 3,000 steps)."))
    tying_patience: int = Field(1, ge=1, description=(
        "Checks in a row without a new held-out minimum before the switch (count). Default 1: "
        "switch at the first rise, the nearest a controller gets to the hindsight switch at the "
        "minimum (one check late)."))
    tying_split: str = Field("validation", min_length=1, description=(
        "Data split whose loss decides the switch (its evaluation batches, as the trial's "
        "evaluation reads them). Default validation: the split a trial's early stopping and "
        "scheduler read; benchmarks/tying/tying.py gives it validation blocks disjoint from the ones "
        "it reports (split 'holdout')."))


class MergeTyingSettings(StrategySettings):
    """Knobs of ``tying: merge`` (:class:`archsearch.dynamic.tying.controllers.MergeTying`):
    train untied while a held-out loss improves, then merge neighbouring groups of blocks, one
    merge per check, while a merge lowers the held-out loss plus a parameter price."""

    tying_check_every: int = Field(100, ge=1, description=(
        "Optimizer steps between two held-out checks (count), before and after the first merge. "
        "Default 100: tying: switch's, benchmarks/tying/tying.py's validation-curve spacing."))
    tying_patience: int = Field(1, ge=1, description=(
        "Checks in a row without a new held-out minimum before merging starts (count). Default 1: "
        "tying: switch's (start at the first rise of the held-out loss)."))
    tying_split: str = Field("validation", min_length=1, description=(
        "Data split whose loss scores the merges (its evaluation batches). Default validation, as "
        "tying: switch; benchmarks give it blocks disjoint from the reported ones."))
    tying_price: float = Field(0.02, ge=0.0, description=(
        "Price of parameters (nats of held-out loss per unit of the block-parameter fraction "
        "n_groups / n_layers): a merge is made when held-out loss + price x fraction drops. "
        "Default 0.02: with 8 blocks a merge may cost up to 0.0025 nats (about 0.25% perplexity); "
        "not tuned (issue 67's first measured design)."))
    tying_tentative: bool = Field(True, description=(
        "Tentative merges (issue 67's second design): the best-scored pair is merged at once, "
        "trained one check interval, and kept only if held-out loss + price x fraction is then "
        "below the model's before the merge; otherwise the pair is untied again by cloning the "
        "merged group's weights and Adam moments, and never tried again. Default True: measured "
        "0.066 validation perplexity below the first design (False: merge only when the pair at "
        "its mean weights already scores better, which never merged), interval excluding 0 "
        "(benchmarks/tying/results/tying_regularised.json, addendum 2)."))


class RLTyingSettings(StrategySettings):
    """Knobs of ``tying: rl`` (:class:`archsearch.dynamic.tying.rl.RLTying`, the Q-learning agent
    of Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024, Sec. 3);
    the agent's own knobs (``tying_gamma`` .. ``tying_target_sync``) are also the defaults of
    :class:`archsearch.dynamic.tying.agent.TyingAgent`."""

    tying_every: int = Field(8, ge=1, description=(
        "Training batches (optimizer steps) per round: at the end of each interval of this many "
        "batches the agent re-decides every block once, and the mean training loss of the next "
        "interval rewards those decisions. Default 8: the value benchmarks/tying/tying.py ran "
        "(issue 16); shorter intervals give noisier rewards, longer ones fewer rounds."))
    tying_explore_frac: float = Field(0.4, gt=0.0, le=1.0, description=(
        "Fraction of the run's rounds in which the agent explores (0 < f <= 1): epsilon decays "
        "per decision from 1 to tying_epsilon_end at the last decision of these rounds, then one "
        "greedy round sets the final map, frozen to the end of training. Default 0.4: docs/design.md "
        "(epsilon ~0.05 by 40% of training); issue 16: an epsilon still at 0.60 at the end left "
        "the final map to chance."))
    tying_max_distinct: int | None = Field(None, ge=1, description=(
        "Budget of trainable parameters (count of blocks, at most n_layers): at most this many "
        "blocks keep weights of their own; actions that would exceed it are never taken nor "
        "bootstrapped from (every block has the same size). Default none = n_layers, no budget; "
        "the agent's reward has no parameter term, so without a budget it unties whatever trains "
        "faster (issue 16's benchmark ran rl_cap2, 2 of 8)."))
    tying_total_steps: int | None = Field(None, ge=1, description=(
        "Run length (optimizer steps) that sets the number of rounds (steps // tying_every) and so "
        "where exploration ends. Default none = as the trial loop counts them: epochs x steps per "
        "epoch (LM: the budget's steps_per_epoch, 200 if unset; classification: ceil(training "
        "rows / batch_size)); set it when a run stops earlier than its budget."))
    tying_gamma: float = Field(0.9, ge=0.0, le=1.0, description=(
        "Discount of the TD target r + gamma * max Q_target(s', a') (the next decision's value). "
        "Default 0.9: docs/design.md (gamma ~0.9); issue 16: 0.99 with single-sample TD updates "
        "left the reward without effect on the final map."))
    tying_lr: float = Field(1e-3, gt=0.0, description=(
        "AdamW learning rate of the Q-network (not the model's lr). Default 1e-3: reaches Q* on "
        "the 3-block MDP of tests/test_tying.py and ran in benchmarks/tying/tying.py."))
    tying_hidden: int = Field(128, ge=1, description=(
        "Hidden width (units) of the Q-network, an MLP n_layers -> hidden -> ReLU -> "
        "n_layers(n_layers+1)/2 action values. Default 128: docs/design.md."))
    tying_epsilon_end: float = Field(0.05, gt=0.0, le=1.0, description=(
        "Exploration rate (probability of a random legal action) reached at the last exploring "
        "decision; epsilon starts at 1 and is multiplied by a constant after each decision. "
        "Default 0.05: docs/design.md."))
    tying_replay_size: int = Field(4096, ge=1, description=(
        "Replay buffer capacity (transitions; one per block decision, n_layers - 1 per round), "
        "oldest overwritten first. Default 4096: more than the decisions of a benchmarks/tying/tying.py "
        "run (3000 steps / 8 x 0.4 x 7 = 1050; issue 16's 4000 steps: 1400), so nothing is "
        "dropped there."))
    tying_replay_batch: int = Field(32, ge=1, description=(
        "Transitions per TD update (minibatch drawn uniformly with replacement from the buffer; "
        "4 updates after each rewarded round). Default 32: issue 16 (single-sample updates left "
        "the reward without effect)."))
    tying_target_sync: int = Field(50, ge=1, description=(
        "TD updates between two copies of the online Q-network into the target network that the "
        "TD target reads. Default 50: docs/design.md (a target network), the value "
        "benchmarks/tying/tying.py ran."))


class PaperTyingSettings(StrategySettings):
    """Knobs of ``tying: paper`` (:class:`archsearch.dynamic.tying.rl.PaperTying`): the agent of
    Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024, Sec. 3,
    paper-inspired (four differences from the authors' code: docs/design.md, "Dynamic layer
    tying"). Every default is the paper's value unless its description says otherwise."""

    tying_every: int = Field(4, ge=1, description=(
        "Training batches (optimizer steps) between two decisions; each decision re-ties one "
        "block, sweeping blocks 1 .. n_layers-1 in turn for the whole run. Default 4: the "
        "paper's code."))
    tying_gamma: float = Field(0.99, ge=0.0, le=1.0, description=(
        "Discount of the online TD target r + gamma * max Q(s', a') (no target network). "
        "Default 0.99: the paper's code."))
    tying_lr: float = Field(1e-3, gt=0.0, description=(
        "AdamW learning rate of the Q-network. Default 1e-3: as tying: rl (the paper's code "
        "uses Adam at 1e-3)."))
    tying_hidden: int = Field(128, ge=1, description=(
        "Hidden width (units) of the Q-network (the same MLP as tying: rl). Default 128."))
    tying_epsilon_decay: float = Field(0.95, gt=0.0, le=1.0, description=(
        "Factor applied to epsilon after each sweep over the blocks (epsilon starts at 1). "
        "Default 0.95: the paper's code."))
    tying_epsilon_end: float = Field(0.01, gt=0.0, le=1.0, description=(
        "Floor of epsilon. Default 0.01: the paper's code."))
    tying_reward_clip: float = Field(100.0, gt=0.0, description=(
        "The reward of a decision is -min(exp(CE), clip), CE the training loss (nats/token) of "
        "the batch that follows it (-perplexity of one batch). Default 100: above a "
        "character model's perplexity at initialisation (vocabulary ~65), so it only cuts "
        "divergence spikes; the paper clips without stating the bound in the text."))
    tying_max_distinct: int | None = Field(None, ge=1, description=(
        "Budget of blocks with weights of their own (at most n_layers), as tying: rl. Default "
        "none: the paper has no budget."))
