"""Synthetic multi-objective test problems (BoTorch's BraninCurrin, DTLZ2, C2DTLZ2) behind the
searchers' problem interface (``name, space, cost_fn, ref, max_hv, evaluate, objectives,
feasible``; ``benchmarks.searchers.searchers.run_one``).

Both objectives are minimised; BoTorch's reference point is given to the searchers as the
objectives' ``ref``. C2DTLZ2's constraint is ``evaluate_slack`` exposed as a metric ``slack``
with the space constraint ``slack: {min: 0}``. Normaliser: BoTorch's ``max_hv`` (analytic for
BraninCurrin and DTLZ2); for C2DTLZ2 (where BoTorch's value is an NSGA-II estimate) the larger
of it and :func:`dtlz2_grid_hv`.
"""

from __future__ import annotations

import functools

from benchmarks.evidence.frontier import hv2_min

#: the problems :class:`Synthetic` knows
PROBLEMS = ("branin_currin", "dtlz2", "c2dtlz2")


def synthetic_space(name: str, dim: int, ref: list[float], trials: int, constraints: dict | None = None):
    """A SearchSpace over ``x0..x{dim-1}`` in [0, 1] with objectives ``f0``, ``f1``... (min)
    whose ``ref`` is the problem's reference point, budget ``trials`` (not validated: the
    metric names are the problem's, not archsearch's METRICS)."""
    from archsearch.space import Budget, FloatParam, Objective, SearchSpace

    params = {f"x{i}": FloatParam(type="float", low=0.0, high=1.0) for i in range(dim)}
    objs = [Objective.model_construct(metric=f"f{j}", mode="min", ref=float(ref[j])) for j in range(len(ref))]
    return SearchSpace.model_construct(name=name, task="classification", params=params,
                                       objectives=objs, constraints=constraints or {},
                                       budget=Budget(trials=trials), fixed={}, seed=0, source=None)


@functools.lru_cache(maxsize=None)
def dtlz2_grid_hv(constrained: bool, n_t: int = 4001, n_g: int = 301) -> float:
    """HV of the feasible points of a grid over the objective set of DTLZ2 (6 dims, 2
    objectives): ``x0 = t`` (n_t values in [0, 1]), ``x1..x5 = 0.5 + sqrt(g / 5)`` (n_g values
    of g = sum (x_i - 0.5)^2 in [0, 1.25]); f = (1 + g)(cos(t pi/2), sin(t pi/2)) covers every
    objective vector DTLZ2 can produce. With ``constrained`` the points C2DTLZ2's slack rules
    out are dropped. A lower bound of the true maximum that converges from below."""
    import torch
    from botorch.test_functions.multi_objective import C2DTLZ2, DTLZ2

    f = C2DTLZ2(dim=6, num_objectives=2) if constrained else DTLZ2(dim=6, num_objectives=2)
    t = torch.linspace(0, 1, n_t, dtype=torch.double)
    g = torch.linspace(0, 1.25, n_g, dtype=torch.double)
    T, G = torch.meshgrid(t, g, indexing="ij")
    X = torch.empty(n_t * n_g, 6, dtype=torch.double)
    X[:, 0] = T.reshape(-1)
    X[:, 1:] = (0.5 + (G.reshape(-1) / 5).sqrt()).unsqueeze(-1)
    Y = f(X)
    if constrained:
        Y = Y[(f.evaluate_slack(X) >= 0).all(-1)]
    return hv2_min(Y.numpy(), f.ref_point.tolist())


class Synthetic:
    """A BoTorch multi-objective test problem (minimised) behind the problem interface.

    Args:
        name: one of :data:`PROBLEMS`.
        trials: the space's budget (the searchers' horizon).
    """

    table = None

    def __init__(self, name: str, trials: int):
        import torch
        from botorch.test_functions.multi_objective import C2DTLZ2, DTLZ2, BraninCurrin

        from archsearch.space import Bound

        self.name = name
        self.f = {"branin_currin": lambda: BraninCurrin(),
                  "dtlz2": lambda: DTLZ2(dim=6, num_objectives=2),
                  "c2dtlz2": lambda: C2DTLZ2(dim=6, num_objectives=2)}[name]()
        self.constrained = name == "c2dtlz2"
        self.dim = self.f.dim
        ref = [float(r) for r in self.f.ref_point]
        self.ref = [-r for r in ref]  # botorch's ref point is for f (minimised); we maximise -f
        self.space = synthetic_space(name, self.dim, ref, trials,
                                     {"slack": Bound(min=0.0)} if self.constrained else None)
        self.max_hv = float(self.f.max_hv)
        self.max_hv_method = "botorch max_hv"
        if self.constrained:
            grid = dtlz2_grid_hv(True)
            self.max_hv_method = (f"max(botorch max_hv {self.max_hv:.6f} (NSGA-II estimate), "
                                  f"HV of the feasible points of a 4001 x 301 grid over DTLZ2's "
                                  f"objective set {grid:.6f})")
            self.max_hv = max(self.max_hv, grid)
        self.cost_fn = None
        self.torch = torch

    def evaluate(self, config):
        x = self.torch.tensor([[config[f"x{i}"] for i in range(self.dim)]], dtype=self.torch.double)
        m = {f"f{j}": float(v) for j, v in enumerate(self.f(x)[0].tolist())}
        if self.constrained:
            m["slack"] = float(self.f.evaluate_slack(x)[0, 0])
        return config, m, False

    def objectives(self, metrics):
        return [-metrics["f0"], -metrics["f1"]]

    def feasible(self, metrics):
        return metrics.get("slack", 0.0) >= 0.0
