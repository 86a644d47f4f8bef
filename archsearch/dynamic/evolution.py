"""Evolutionary search of per-layer length configurations of a trained length-adaptive model.

Source: Kim & Cho, "Length-Adaptive Transformer: Train Once with Length Drop, Use Anytime with
Search", arXiv 2010.07003, sec. 4 (and the Length-Adaptive section of docs/design.md):

* a *gene* is a length configuration ``(l_1, ..., l_L)``, non-increasing, each in
  ``[min_tokens, n]`` (see :mod:`archsearch.dynamic.length_config`);
* the initial population holds constant-ratio reductions (every layer keeps the fraction ``q``
  of its input, ``q`` from 1 down to 0) spanning the FLOPs range, from full length to
  ``min_tokens`` everywhere;
* each iteration draws parents from the current Pareto front (metric best, FLOPs min) and
  produces ``mutations`` new genes by mutation (each layer resampled with probability 0.5 in
  ``[l_{i+1}, l'_{i-1}]``, which keeps the lengths non-increasing) and ``crossovers`` new genes
  by crossover (ceiling of the element-wise mean of two parents); a gene already evaluated is
  not counted and is redrawn (at most ``attempts_per_child`` draws per child);
* the front is recomputed over everything evaluated (with
  :func:`archsearch.pareto.non_dominated_mask`).

Every evaluated gene is cached (an evaluation runs a validation subset). With ``store_path`` the
search state (evaluated genes, finished iterations, RNG state) is written atomically (temporary
file + ``os.replace``) after the initial population and after each iteration, and a new search on
the same store resumes where it stopped: cached genes are not re-evaluated and the RNG continues,
so an interrupted and resumed search ends with the same store as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.dynamic.length_config import MIN_TOKENS, check_length_config, constant_ratio_config
from archsearch.pareto import non_dominated_mask

Gene = tuple[int, ...]
STORE_VERSION = 1


def initial_population(n_layers: int, n: int, size: int = 10, min_tokens: int = MIN_TOKENS) -> list[Gene]:
    """Constant-ratio genes for keep fractions ``q`` evenly spaced from 1 to 0 (duplicates
    removed): from the full model down to ``min_tokens`` in every layer.

    Raises:
        ValueError: ``size < 2``.
    """
    if size < 2:
        raise ValueError(f"initial population size must be >= 2, got {size}")
    out: list[Gene] = []
    for q in np.linspace(1.0, 0.0, size):
        g = constant_ratio_config(n_layers, n, float(q), min_tokens)
        if g not in out:
            out.append(g)
    return out


def mutate(gene: Sequence[int], n: int, rng: random.Random, prob: float = 0.5,
           min_tokens: int = MIN_TOKENS) -> Gene:
    """Resample each layer with probability ``prob`` uniformly in ``[l_{i+1}, l'_{i-1}]``
    (``l'_{i-1}`` the already-mutated previous layer, ``l'_0 = n``; ``l_{L+1} = min_tokens``),
    so the result stays non-increasing (Kim & Cho 2020, sec. 4)."""
    g = [int(v) for v in gene]
    out: list[int] = []
    for i in range(len(g)):
        if rng.random() < prob:
            hi = n if i == 0 else out[i - 1]
            lo = min(min_tokens, hi) if i == len(g) - 1 else g[i + 1]
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
    """Evolutionary search of length configurations (Kim & Cho 2020, sec. 4).

    Args:
        evaluate: ``gene -> (metric, flops_per_sample)``; called once per distinct gene.
        n_layers: ``L``, genes have ``L`` entries.
        n: reference sequence length (``max_len``).
        mode: ``"max"`` (accuracy) or ``"min"`` (perplexity) for the metric.
        iterations, mutations, crossovers: the paper's 30 x 30 x 30 by default.
        mutation_prob: per-layer resampling probability (0.5).
        initial_size: constant-ratio genes in the initial population.
        min_tokens: smallest allowed length.
        store_path: JSON file for resuming (``None`` = in memory only).
        seed: RNG seed (ignored when resuming: the stored RNG state continues).
        attempts_per_child: draws allowed per new child before the iteration gives up on it
            (small spaces run out of new genes).

    Raises:
        ValueError: bad mode or sizes, or a store written for another ``n_layers``/``n``/``mode``.
    """

    def __init__(self, evaluate: Callable[[Gene], tuple[float, float]], *, n_layers: int, n: int,
                 mode: str = "max", iterations: int = 30, mutations: int = 30, crossovers: int = 30,
                 mutation_prob: float = 0.5, initial_size: int = 10, min_tokens: int = MIN_TOKENS,
                 store_path: str | os.PathLike | None = None, seed: int = 0,
                 attempts_per_child: int = 20):
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if iterations < 0 or mutations < 0 or crossovers < 0 or n_layers < 1 or n < 1:
            raise ValueError("iterations, mutations and crossovers must be >= 0; n_layers and n >= 1")
        self.evaluate_fn = evaluate
        self.n_layers, self.n, self.mode = n_layers, n, mode
        self.iterations, self.mutations, self.crossovers = iterations, mutations, crossovers
        self.mutation_prob, self.initial_size, self.min_tokens = mutation_prob, initial_size, min_tokens
        self.attempts_per_child = attempts_per_child
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
        for key, mine in (("n_layers", self.n_layers), ("n", self.n), ("mode", self.mode)):
            if s.get(key) != mine:
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
        if gene in self.evaluated:
            return False
        metric, flops = self.evaluate_fn(gene)
        self.n_evaluations += 1
        self.evaluated[gene] = {"metric": float(metric), "flops_per_sample": float(flops),
                                "origin": origin, "iteration": self.iteration + (origin != "initial")}
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
            return mutate(self.rng.choice(parents), self.n, self.rng, self.mutation_prob, self.min_tokens)

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
        """Evaluate the initial population (if not stored yet), run the remaining iterations up
        to ``iterations`` and return :meth:`front`."""
        if not self.started:
            for g in initial_population(self.n_layers, self.n, self.initial_size, self.min_tokens):
                self._add(g, "initial")
            self.started = True
            self.save()
        while self.iteration < self.iterations:
            self.step()
        return self.front()
