"""Tests for archsearch.dynamic.length.evolution: the genetic operators keep the monotone constraint,
the front is the Pareto set, and a resumed search continues from its store.

The search runs on a deterministic analytic objective (accuracy-like score that grows with the
kept tokens, FLOPs from the real cost function of a real model config), so every run is exact
and fast; the search on a trained model is tested in test_length_drop.py.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from archsearch.dynamic.length.config import smallest_length_config
from archsearch.dynamic.length.evolution import (
    EvolutionarySearch,
    crossover,
    initial_population,
    interpolate,
    mutate,
)
from archsearch.dynamic.length.forward import length_config_flops
from archsearch.models.transformer import TransformerConfig

L, N = 6, 48
CONFIG = TransformerConfig(vocab_size=100, max_len=N, n_layers=L, d_model=32, n_heads=4, d_ffn=64)


def monotone(g, n=N, lo=2):
    return all(lo <= v for v in g) and g[0] <= n and all(a >= b for a, b in zip(g, g[1:]))


class Objective:
    """score = 1 - exp(-weighted kept fraction) (later layers matter less); FLOPs analytic."""

    def __init__(self):
        self.calls = []

    def __call__(self, g):
        self.calls.append(tuple(g))
        w = np.linspace(1.0, 0.3, L)
        score = 1.0 - math.exp(-3.0 * float(np.dot(w, np.asarray(g) / N)) / w.sum())
        return score, float(length_config_flops(CONFIG, [N, *g]))


def random_gene(rng):
    out, prev = [], N
    for _ in range(L):
        prev = rng.randint(2, prev)
        out.append(prev)
    return tuple(out)


def test_mutation_keeps_lengths_non_increasing_and_in_range():
    rng = random.Random(0)
    changed = 0
    for _ in range(2000):
        g = random_gene(rng)
        m = mutate(g, N, rng, 0.5)
        assert len(m) == L and monotone(m), (g, m)
        changed += m != g
    assert changed > 1000  # prob 0.5 per layer: almost every gene changes somewhere
    assert mutate((48, 40, 30, 20, 10, 2), N, rng, 0.0) == (48, 40, 30, 20, 10, 2)


def test_crossover_is_ceil_of_the_mean_and_keeps_the_constraint():
    assert crossover((48, 41, 30, 3), (47, 40, 2, 2)) == (48, 41, 16, 3)
    rng = random.Random(1)
    for _ in range(2000):
        a, b = random_gene(rng), random_gene(rng)
        c = crossover(a, b)
        assert monotone(c)
        assert all(x == math.ceil((p + q) / 2) for x, p, q in zip(c, a, b))
    with pytest.raises(ValueError):
        crossover((4, 3), (4, 3, 2))


def test_initial_population_spans_full_to_smallest_with_decreasing_flops():
    pop = initial_population(L, N, 10)
    assert pop[0] == (N,) * L and pop[-1] == (2,) * L
    assert all(monotone(g) for g in pop)
    flops = [length_config_flops(CONFIG, [N, *g]) for g in pop]
    assert flops == sorted(flops, reverse=True) and len(set(flops)) == len(flops)


def test_search_front_is_the_pareto_set_and_improves_on_the_initial_population(tmp_path):
    obj = Objective()
    s = EvolutionarySearch(obj, n_layers=L, n=N, iterations=3, mutations=8, crossovers=8, seed=0)
    front = s.run()
    assert len(obj.calls) == len(set(obj.calls)) == len(s.evaluated)  # each gene evaluated once
    assert len(s.evaluated) == len(initial_population(L, N)) + 3 * 16
    f = [p["flops_per_sample"] for p in front]
    a = [p["metric"] for p in front]
    assert f == sorted(f) and all(y > x for x, y in zip(a, a[1:]))
    for g, v in s.evaluated.items():  # nothing evaluated dominates a front point
        assert monotone(g)
        for p in front:
            assert not (v["flops_per_sample"] <= p["flops_per_sample"] and v["metric"] >= p["metric"]
                        and (v["flops_per_sample"], v["metric"]) != (p["flops_per_sample"], p["metric"]))
    # the search found configurations that are not constant-ratio ones on the front
    assert any(s.evaluated[tuple(p["length_config"])]["origin"] != "initial" for p in front)


def test_a_resumed_search_continues_from_its_store(tmp_path):
    store = tmp_path / "store.json"
    whole = EvolutionarySearch(Objective(), n_layers=L, n=N, iterations=4, mutations=6, crossovers=6,
                               seed=5, store_path=tmp_path / "whole.json")
    whole.run()

    first_obj = Objective()
    first = EvolutionarySearch(first_obj, n_layers=L, n=N, iterations=2, mutations=6, crossovers=6,
                               seed=5, store_path=store)
    first.run()
    saved = json.loads(store.read_text())
    assert saved["iteration"] == 2 and len(saved["evaluated"]) == len(first.evaluated)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic write left nothing

    # a new search object on the same store (seed ignored) does the 2 remaining iterations only
    second_obj = Objective()
    second = EvolutionarySearch(second_obj, n_layers=L, n=N, iterations=4, mutations=6, crossovers=6,
                                seed=999, store_path=store)
    assert second.iteration == 2 and len(second.evaluated) == len(first.evaluated)
    second.run()
    assert second.n_evaluations == len(second_obj.calls) == 2 * 12
    assert not set(second_obj.calls) & set(first_obj.calls)  # the cache is used, nothing re-evaluated
    # ... and ends exactly where the uninterrupted search ended
    assert json.loads(store.read_text())["evaluated"] == json.loads((tmp_path / "whole.json").read_text())["evaluated"]
    assert second.front() == whole.front()
    # running it again does nothing
    third_obj = Objective()
    EvolutionarySearch(third_obj, n_layers=L, n=N, iterations=4, store_path=store).run()
    assert third_obj.calls == []


def test_store_of_another_search_is_rejected(tmp_path):
    store = tmp_path / "s.json"
    EvolutionarySearch(Objective(), n_layers=L, n=N, iterations=0, store_path=store).run()
    with pytest.raises(ValueError, match="n_layers"):
        EvolutionarySearch(Objective(), n_layers=L - 1, n=N, store_path=store)
    with pytest.raises(ValueError, match="mode"):
        EvolutionarySearch(Objective(), n_layers=L, n=N, mode="min", store_path=store)


def flops_of(g):
    return float(length_config_flops(CONFIG, [N, *g]))


FLOOR = smallest_length_config(L, N, 0.2)  # (39, 32, 26, 21, 17, 14): the smallest trained sub-model


def test_initial_population_is_evenly_spread_in_flops_between_the_floor_and_the_full_model():
    pop = initial_population(L, N, 10, floor=FLOOR, flops_fn=flops_of)
    assert pop[0] == (N,) * L and pop[-1] == FLOOR
    assert all(monotone(g) and all(v >= f for v, f in zip(g, FLOOR)) for g in pop)
    f = np.array([flops_of(g) for g in pop])
    assert len(pop) == 10 and np.all(np.diff(f) < 0)
    targets = np.linspace(f[0], f[-1], 10)
    step = (f[0] - f[-1]) / 9
    # each gene is the first interpolated gene at or above its target: within one token's FLOPs
    assert np.all(f >= targets - 1e-6) and np.all(f - targets < 0.1 * step)
    assert interpolate(FLOOR, N, 0.0) == FLOOR and interpolate(FLOOR, N, 1.0) == (N,) * L


def test_search_never_goes_below_the_smallest_trained_sub_model():
    obj = Objective()
    s = EvolutionarySearch(obj, n_layers=L, n=N, iterations=4, mutations=10, crossovers=10, seed=2,
                           floor=FLOOR, flops_fn=flops_of)
    s.run()
    assert len(s.evaluated) > 40
    for g in s.evaluated:
        assert monotone(g) and all(v >= f for v, f in zip(g, FLOOR)), g
    rng = random.Random(0)
    for _ in range(500):
        assert all(v >= f for v, f in zip(mutate(FLOOR, N, rng, 1.0, floor=FLOOR), FLOOR))
    with pytest.raises(ValueError, match="floor"):
        s._add((N, N, N, N, N, 2), "test")


def test_best_under_each_budget_is_the_most_accurate_config_within_it_not_the_cheapest():
    """Known accuracy/FLOPs table: under 0.5x the answer is the 0.48x config (acc 0.90), not the
    cheapest 0.15x one nor the 0.52x one just over the budget; under 0.35x the 0.33x config."""
    table = {  # gene: (accuracy, FLOPs fraction)
        (48, 48, 48, 48, 48, 48): (0.92, 1.00),
        (48, 40, 30, 30, 20, 20): (0.91, 0.52),
        (40, 30, 30, 20, 20, 10): (0.90, 0.48),
        (40, 30, 20, 20, 10, 10): (0.86, 0.45),
        (30, 20, 20, 10, 10, 10): (0.87, 0.33),
        (30, 20, 10, 10, 10, 10): (0.84, 0.30),
        (10, 8, 6, 4, 2, 2): (0.70, 0.15),
    }
    full = 1000.0
    s = EvolutionarySearch(lambda g: (table[g][0], table[g][1] * full), n_layers=L, n=N, iterations=0)
    for g in table:
        s._add(g, "initial")
    best = s.best_per_budget([0.5, 0.35], full)
    assert best[0.5]["length_config"] == [40, 30, 30, 20, 20, 10] and best[0.5]["metric"] == 0.90
    assert best[0.35]["length_config"] == [30, 20, 20, 10, 10, 10]
    assert all(best[q]["flops_per_sample"] <= q * full for q in best)
    assert len({tuple(e["length_config"]) for e in best.values()}) == 2
    assert s.best_under(0.1 * full) is None
    assert s.best_under(full)["metric"] == 0.92
    # perplexity (mode min): lower is better, same budget rule
    m = EvolutionarySearch(lambda g: (1.0 / table[g][0], table[g][1] * full), n_layers=L, n=N,
                           mode="min", iterations=0)
    for g in table:
        m._add(g, "initial")
    assert m.best_under(0.5 * full)["length_config"] == [40, 30, 30, 20, 20, 10]


def test_seeded_genes_join_the_initial_population_and_are_checked_against_the_floor(tmp_path):
    """Issue 67: genes at exactly the budgets to be read (constant-ratio configurations) are
    evaluated with the initial population (origin ``seeded``, iteration 0) and only once when
    the search resumes from its store; a seeded gene below the floor is refused."""
    from archsearch.dynamic.length.config import constant_ratio_config

    seeded = [constant_ratio_config(L, N, k) for k in (0.93, 0.86)]
    obj = Objective()
    s = EvolutionarySearch(obj, n_layers=L, n=N, iterations=1, mutations=2, crossovers=2, seed=0,
                           floor=FLOOR, flops_fn=flops_of, seeded=seeded, store_path=tmp_path / "s.json")
    s.run()
    for g in seeded:
        assert s.evaluated[g]["origin"] == "seeded" and s.evaluated[g]["iteration"] == 0
        assert obj.calls.count(g) == 1
    again = Objective()
    EvolutionarySearch(again, n_layers=L, n=N, iterations=1, mutations=2, crossovers=2, seed=0,
                       floor=FLOOR, flops_fn=flops_of, seeded=seeded, store_path=tmp_path / "s.json").run()
    assert again.calls == []
    with pytest.raises(ValueError, match="seeded gene .* below the floor"):
        EvolutionarySearch(obj, n_layers=L, n=N, floor=FLOOR, seeded=[(N, N, N, N, N, 2)])
