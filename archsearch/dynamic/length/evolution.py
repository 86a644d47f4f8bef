"""Evolutionary search of per-layer length configurations of a trained length-adaptive model.

Source: Kim & Cho, "Length-Adaptive Transformer: Train Once with Length Drop, Use Anytime with
Search", arXiv 2010.07003, sec. 4 (and the Length-Adaptive section of docs/design.md):

* a *gene* is a length configuration ``(l_1, ..., l_L)``, non-increasing, each in
  ``[min_tokens, n]`` (see :mod:`archsearch.dynamic.length.config`);
* genes never go below the *floor*, the smallest trained sub-model (``floor``, e.g.
  :func:`~archsearch.dynamic.length.config.smallest_length_config` of the LengthDrop ``p``;
  default ``min_tokens`` everywhere): a shorter configuration was never trained, and its
  accuracy on a small validation subset is noise;
* the initial population is spread evenly in FLOPs between the floor and the full model:
  ``initial_size`` genes interpolated layer by layer between the two (``ceil(f_i + t (n - f_i))``,
  non-increasing for every ``t``), ``t`` chosen by bisection so that the genes' FLOPs
  (``flops_fn``; default the sum of lengths) are evenly spaced from FLOPs(floor) to FLOPs(full);
  ``seeded`` genes (e.g. constant-ratio configurations at the FLOPs budgets that will be read,
  the paper's own initial population, sec. 4) join it;
* each iteration draws parents from the current Pareto front (metric best, FLOPs min) and
  produces ``mutations`` new genes by mutation (each layer resampled with probability 0.5 in
  ``[max(l_{i+1}, f_i), l'_{i-1}]``, which keeps the lengths non-increasing and above the floor)
  and ``crossovers`` new genes
  by crossover (ceiling of the element-wise mean of two parents); a gene already evaluated is
  not counted and is redrawn (at most ``attempts_per_child`` draws per child);
* the front is recomputed over everything evaluated (with
  :func:`archsearch.pareto.non_dominated_mask`);
* per FLOPs budget, :meth:`EvolutionarySearch.best_under` returns the best-metric gene among
  everything evaluated whose FLOPs are ``<=`` the budget (ties: fewer FLOPs), i.e. the front
  point just under the budget, not the cheapest one.

Every evaluated gene is cached (an evaluation runs a validation subset). With ``store_path`` the
search state (evaluated genes, finished iterations, RNG state) is written atomically (temporary
file + ``os.replace``) after the initial population and after each iteration, and a new search on
the same store resumes where it stopped: cached genes are not re-evaluated and the RNG continues,
so an interrupted and resumed search ends with the same store as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.dynamic.length.config import MIN_TOKENS, check_length_config
from archsearch.pareto import non_dominated_mask

Gene = tuple[int, ...]
STORE_VERSION = 1


def interpolate(floor: Sequence[int], n: int, t: float) -> Gene:
    """The gene ``ceil(f_i + t (n - f_i))`` between ``floor`` (``t = 0``) and full length
    ``n`` (``t = 1``); non-increasing when ``floor`` is."""
    return tuple(min(n, math.ceil(round(f + t * (n - f), 9))) for f in floor)


def initial_population(n_layers: int, n: int, size: int = 10, min_tokens: int = MIN_TOKENS,
                       floor: Sequence[int] | None = None,
                       flops_fn: Callable[[Gene], float] | None = None) -> list[Gene]:
    """``size`` genes evenly spaced in FLOPs from the full model down to ``floor``.

    Args:
        n_layers, n: genes have ``n_layers`` entries in ``[floor_i, n]``.
        size: genes wanted (fewer when two targets round to the same gene).
        min_tokens: the floor when ``floor`` is ``None`` (``min_tokens`` in every layer).
        floor: the smallest trained sub-model (non-increasing, ``L`` entries).
        flops_fn: ``gene -> FLOPs per sample`` (e.g. ``length_config_flops`` of the model);
            default the sum of lengths. Must grow with every length.

    Returns:
        Genes sorted from the full model (first) to ``floor`` (last), duplicates removed; gene
        ``j`` is the interpolated gene (:func:`interpolate`) whose FLOPs are the first ``>=``
        ``F(floor) + (size - 1 - j) / (size - 1) * (F(full) - F(floor))``.

    Raises:
        ValueError: ``size < 2`` or an invalid floor.
    """
    if size < 2:
        raise ValueError(f"initial population size must be >= 2, got {size}")
    lo_gene = (check_length_config(floor, n_layers, n, min_tokens) if floor is not None
               else (min(min_tokens, n),) * n_layers)
    fl = flops_fn if flops_fn is not None else (lambda g: float(sum(g)))
    f_lo, f_hi = float(fl(lo_gene)), float(fl((n,) * n_layers))
    out: list[Gene] = []
    for target in np.linspace(f_hi, f_lo, size):
        a, b = 0.0, 1.0  # smallest t with F(interpolate(t)) >= target (F grows with t)
        for _ in range(40):
            mid = (a + b) / 2
            if fl(interpolate(lo_gene, n, mid)) >= target:
                b = mid
            else:
                a = mid
        g = interpolate(lo_gene, n, b)
        if g not in out:
            out.append(g)
    return out


def mutate(gene: Sequence[int], n: int, rng: random.Random, prob: float = 0.5,
           min_tokens: int = MIN_TOKENS, floor: Sequence[int] | None = None) -> Gene:
    """Resample each layer with probability ``prob`` uniformly in ``[max(l_{i+1}, f_i),
    l'_{i-1}]`` (``l'_{i-1}`` the already-mutated previous layer, ``l'_0 = n``; ``l_{L+1} =
    min_tokens``; ``f`` the floor, default ``min_tokens``), so the result stays non-increasing
    and never goes below the floor when ``gene`` does not (Kim & Cho 2021, sec. 4)."""
    g = [int(v) for v in gene]
    fl = [min_tokens] * len(g) if floor is None else [int(v) for v in floor]
    out: list[int] = []
    for i in range(len(g)):
        if rng.random() < prob:
            hi = n if i == 0 else out[i - 1]
            lo = min_tokens if i == len(g) - 1 else g[i + 1]
            lo = min(max(lo, fl[i]), hi)
            out.append(rng.randint(lo, hi))
        else:
            out.append(g[i])
    return tuple(out)


def crossover(a: Sequence[int], b: Sequence[int]) -> Gene:
    """Ceiling of the element-wise mean of two genes (non-increasing if both are).

    Raises:
        ValueError: genes of different lengths.
    """
    if len(a) != len(b):
        raise ValueError(f"genes of different lengths: {len(a)} and {len(b)}")
    return tuple((int(x) + int(y) + 1) // 2 for x, y in zip(a, b))


class EvolutionarySearch:
    """Evolutionary search of length configurations (Kim & Cho 2021, sec. 4).

    Args:
        evaluate: ``gene -> (metric, flops_per_sample)``; called once per distinct gene.
        n_layers: ``L``, genes have ``L`` entries.
        n: reference sequence length (``max_len``).
        mode: ``"max"`` (accuracy) or ``"min"`` (perplexity) for the metric.
        iterations, mutations, crossovers: the paper's 30 x 30 x 30 by default.
        mutation_prob: per-layer resampling probability (0.5).
        initial_size: genes in the initial population (evenly spaced in FLOPs).
        min_tokens: smallest allowed length.
        floor: per-layer smallest allowed lengths (the smallest trained sub-model; ``None`` =
            ``min_tokens`` everywhere). Genes below it are never generated nor evaluated.
        flops_fn: ``gene -> FLOPs per sample`` used to spread the initial population (default:
            sum of lengths); the FLOPs of the front come from ``evaluate``.
        store_path: JSON file for resuming (``None`` = in memory only).
        seed: RNG seed (ignored when resuming: the stored RNG state continues).
        attempts_per_child: draws allowed per new child before the iteration gives up on it
            (small spaces run out of new genes).
        seeded: genes evaluated with the initial population (origin ``"seeded"``), e.g.
            :func:`~archsearch.dynamic.length.config.constant_ratio_config` at exactly the budgets
            that :meth:`best_under` will read; each must be valid and not below ``floor``.

    Raises:
        ValueError: bad mode or sizes, an invalid floor, or a store written for another
            ``n_layers``/``n``/``mode``.
    """

    def __init__(self, evaluate: Callable[[Gene], tuple[float, float]], *, n_layers: int, n: int,
                 mode: str = "max", iterations: int = 30, mutations: int = 30, crossovers: int = 30,
                 mutation_prob: float = 0.5, initial_size: int = 10, min_tokens: int = MIN_TOKENS,
                 store_path: str | os.PathLike | None = None, seed: int = 0,
                 attempts_per_child: int = 20, floor: Sequence[int] | None = None,
                 flops_fn: Callable[[Gene], float] | None = None, seeded: Sequence[Sequence[int]] = ()):
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if iterations < 0 or mutations < 0 or crossovers < 0 or n_layers < 1 or n < 1:
            raise ValueError("iterations, mutations and crossovers must be >= 0; n_layers and n >= 1")
        self.evaluate_fn = evaluate
        self.n_layers, self.n, self.mode = n_layers, n, mode
        self.iterations, self.mutations, self.crossovers = iterations, mutations, crossovers
        self.mutation_prob, self.initial_size, self.min_tokens = mutation_prob, initial_size, min_tokens
        self.attempts_per_child = attempts_per_child
        self.floor: Gene = (check_length_config(floor, n_layers, n, min_tokens) if floor is not None
                            else (min(min_tokens, n),) * n_layers)
        self.flops_fn = flops_fn
        self.seeded = [check_length_config(g, n_layers, n, min_tokens) for g in seeded]
        for g in self.seeded:
            if any(v < f for v, f in zip(g, self.floor)):
                raise ValueError(f"seeded gene {list(g)} is below the floor {list(self.floor)}")
        self.store_path = None if store_path is None else Path(store_path)
        self.rng = random.Random(seed)
        self.evaluated: dict[Gene, dict[str, Any]] = {}
        self.iteration = 0  # finished iterations (0 = only the initial population)
        self.started = False
        self.n_evaluations = 0  # evaluations run by this object (cache misses)
        if self.store_path is not None and self.store_path.exists():
            self._load()

    # -- store ------------------------------------------------------------------------------

    def _load(self) -> None:
        with open(self.store_path) as f:
            s = json.load(f)
        if s.get("version") != STORE_VERSION:
            raise ValueError(f"{self.store_path}: unknown store version {s.get('version')!r}")
        for key, mine in (("n_layers", self.n_layers), ("n", self.n), ("mode", self.mode),
                          ("floor", list(self.floor))):
            if s.get(key, mine) != mine:  # stores written before the floor existed: no check
                raise ValueError(f"{self.store_path}: store has {key}={s.get(key)!r}, this search {mine!r}")
        self.evaluated = {tuple(e["length_config"]): {k: v for k, v in e.items() if k != "length_config"}
                          for e in s["evaluated"]}
        self.iteration = int(s["iteration"])
        self.started = True
        st = s["rng_state"]
        self.rng.setstate((st[0], tuple(st[1]), st[2]))

    def save(self) -> None:
        """Write the state to ``store_path`` atomically (no-op without a store)."""
        if self.store_path is None:
            return
        s = {"version": STORE_VERSION, "n_layers": self.n_layers, "n": self.n, "mode": self.mode,
             "floor": list(self.floor),
             "iteration": self.iteration, "rng_state": list(self.rng.getstate()),
             "evaluated": [{"length_config": list(g), **v} for g, v in self.evaluated.items()]}
        self.store_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.store_path.with_name(f".{self.store_path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(s, f)
        os.replace(tmp, self.store_path)

    # -- search -----------------------------------------------------------------------------

    def _add(self, gene: Gene, origin: str) -> bool:
        """Evaluate ``gene`` unless cached; True when it was new."""
        gene = check_length_config(gene, self.n_layers, self.n, self.min_tokens)
        if any(v < f for v, f in zip(gene, self.floor)):
            raise ValueError(f"gene {list(gene)} is below the floor {list(self.floor)}")
        if gene in self.evaluated:
            return False
        metric, flops = self.evaluate_fn(gene)
        self.n_evaluations += 1
        self.evaluated[gene] = {"metric": float(metric), "flops_per_sample": float(flops),
                                "origin": origin, "iteration": self.iteration + (origin not in ("initial", "seeded"))}
        return True

    def front(self) -> list[dict[str, Any]]:
        """The Pareto set of everything evaluated (metric ``mode``, FLOPs min), sorted by FLOPs;
        of genes with identical (FLOPs, metric) only the first evaluated is kept. Each entry:
        ``{"length_config": [...], "metric": m, "flops_per_sample": f}``."""
        genes = list(self.evaluated)
        if not genes:
            return []
        Y = np.array([[self.evaluated[g]["metric"], self.evaluated[g]["flops_per_sample"]] for g in genes])
        keep = non_dominated_mask(Y, [self.mode, "min"])
        out, seen = [], set()
        for g, k in zip(genes, keep):
            v = self.evaluated[g]
            key = (v["flops_per_sample"], v["metric"])
            if k and key not in seen:
                seen.add(key)
                out.append({"length_config": list(g), "metric": v["metric"],
                            "flops_per_sample": v["flops_per_sample"]})
        return sorted(out, key=lambda e: (e["flops_per_sample"], e["metric"]))

    def _children(self, count: int, make: Callable[[list[Gene]], Gene], parents: list[Gene],
                  origin: str) -> None:
        made, attempts = 0, 0
        while made < count and attempts < count * self.attempts_per_child:
            attempts += 1
            if self._add(make(parents), origin):
                made += 1

    def step(self) -> None:
        """One iteration: mutations then crossovers of parents drawn from the front at the start
        of the iteration, then save."""
        parents = [tuple(e["length_config"]) for e in self.front()]
        def mut(parents: list[Gene]) -> Gene:
            return mutate(self.rng.choice(parents), self.n, self.rng, self.mutation_prob, self.min_tokens,
                          self.floor)

        def cross(parents: list[Gene]) -> Gene:
            pool = parents if len(parents) >= 2 else list(self.evaluated)
            if len(pool) < 2:
                return pool[0]
            a, b = self.rng.sample(pool, 2)
            return crossover(a, b)

        self._children(self.mutations, mut, parents, "mutation")
        self._children(self.crossovers, cross, parents, "crossover")
        self.iteration += 1
        self.save()

    def run(self) -> list[dict[str, Any]]:
        """Evaluate the initial population and the ``seeded`` genes (if not stored yet), run the
        remaining iterations up to ``iterations`` and return :meth:`front`."""
        if not self.started:
            for g in initial_population(self.n_layers, self.n, self.initial_size, self.min_tokens,
                                        self.floor, self.flops_fn):
                self._add(g, "initial")
            for g in self.seeded:
                self._add(g, "seeded")
            self.started = True
            self.save()
        while self.iteration < self.iterations:
            self.step()
        return self.front()

    def best_under(self, budget_flops: float) -> dict[str, Any] | None:
        """The best gene whose FLOPs are within ``budget_flops``.

        Args:
            budget_flops: FLOPs per sample allowed (same unit as ``evaluate``'s FLOPs).

        Returns:
            ``{"length_config", "metric", "flops_per_sample"}`` of the evaluated gene with the
            best metric (``mode``) among those with ``flops_per_sample <= budget_flops``; ties
            go to fewer FLOPs, then to the earlier evaluated. ``None`` when no gene fits.
        """
        best, key_best = None, None
        sign = 1.0 if self.mode == "max" else -1.0
        for g, v in self.evaluated.items():
            if v["flops_per_sample"] > budget_flops:
                continue
            key = (sign * v["metric"], -v["flops_per_sample"])
            if key_best is None or key > key_best:
                best, key_best = g, key
        if best is None:
            return None
        v = self.evaluated[best]
        return {"length_config": list(best), "metric": v["metric"], "flops_per_sample": v["flops_per_sample"]}

    def best_per_budget(self, fractions: Sequence[float], full_flops: float) -> dict[float, dict[str, Any] | None]:
        """:meth:`best_under` for each budget ``fraction * full_flops`` (e.g. ``(0.5, 0.35)``
        and the full model's FLOPs on the same data); ``{fraction: entry or None}``."""
        return {float(q): self.best_under(float(q) * full_flops) for q in fractions}
