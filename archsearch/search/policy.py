"""AHTO's meta-trained acquisition policy: a small network that re-scores the candidates of the
acquisition optimiser from dimension-free features, so one policy serves any search space.

Design (MetaBO, Volpp et al. ICLR 2020, sec. 4: a neural acquisition function over the GP's
posterior, meta-trained on related tasks; here as a *residual* on qLogNEHVI, Ament et al. 2023):

* **Candidates** (:func:`candidate_pool`): the ``optimize_acqf`` restarts, a scrambled Sobol set
  of the unit cube, Gaussian perturbations of the observed Pareto-front points and of the
  restarts; rounded to valid configs by the space.
* **Features** (:data:`FEATURES`, :func:`candidate_features`), per candidate, none tied to the
  search space's dimension or parameter names: the log acquisition value relative to the pool's
  best and its rank; per objective (up to two) the GP posterior mean's gap to the best observed
  value and the posterior standard deviation, both in units of the observed standard deviation;
  the probability of feasibility under the learned constraints; the distance to the nearest
  observed point and to the nearest front point (unit cube, divided by ``sqrt(d)``); the
  fraction of the trial budget used; what proposed the candidate.
* **Score** = ``log_acq_gap + g(features)``, ``g`` a 2-layer tanh MLP whose last layer starts at
  zero: an untrained policy is exactly "argmax of the log acquisition over the pool". The
  searcher proposes the candidate with the highest score.
* **Training** (``benchmarks/ahto_policy/ahto_policy.py``): across the LCBench meta-training tasks, the
  per-step reduction of log10 hypervolume regret of *every* candidate is known (the surrogate
  evaluates them all), so the policy gradient of the expected one-step reward under
  ``softmax(score / temperature)`` is computed exactly over the pool (an all-action policy
  gradient, as Mean Actor-Critic, Asadi et al. 2017), with an L2 penalty on ``g`` toward
  plain qLogNEHVI. The weights ship as ``ahto_policy.json`` beside this module, with a manifest
  (training tasks, seeds, commit, wall time, the validation choice).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

DTYPE = torch.double
WEIGHTS = Path(__file__).with_name("ahto_policy.json")
SOURCES = ("optimizer", "sobol", "front_perturbation", "optimizer_perturbation")
FEATURES = ("log_acq_gap", "log_acq_rank", "mean_gap_0", "sd_0", "mean_gap_1", "sd_1", "p_feasible",
            "dist_observed", "dist_front", "budget_used") + tuple(f"from_{s}" for s in SOURCES)


class PolicyNet(torch.nn.Module):
    """``score = x[:, 0] + MLP(x)``: the residual MLP ``F -> hidden -> hidden -> 1`` (tanh).

    Args:
        n_features: ``F`` (``len(FEATURES)``).
        hidden: width of both hidden layers.

    Shapes: ``forward(x)``: ``x`` ``(n, F)`` float64 -> ``(n,)`` scores.
    """

    def __init__(self, n_features: int = len(FEATURES), hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_features, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)).to(DTYPE)
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] + self.residual(x)

    def to_json(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return {"manifest": manifest, "features": list(FEATURES), "hidden": self.net[0].out_features,
                "state": {k: v.tolist() for k, v in self.state_dict().items()}}

    @classmethod
    def from_json(cls, blob: dict[str, Any]) -> "PolicyNet":
        """Raises: ValueError: the file's feature list differs from :data:`FEATURES`."""
        if list(blob.get("features", [])) != list(FEATURES):
            raise ValueError(f"policy weights: features {blob.get('features')} != {list(FEATURES)}")
        net = cls(len(FEATURES), int(blob["hidden"]))
        net.load_state_dict({k: torch.tensor(v, dtype=DTYPE) for k, v in blob["state"].items()})
        return net.eval()


#: the features :class:`LinearPolicy` also multiplies by ``budget_used`` (constant within an ask,
#: so only its products with per-candidate features can change a choice)
BUDGET_PRODUCTS = ("log_acq_gap", "mean_gap_0", "sd_0", "mean_gap_1", "sd_1", "dist_observed", "dist_front")


class LinearPolicy(torch.nn.Module):
    """``score = x[:, 0] + z @ w``, ``z`` = the features ``x`` and ``budget_used`` times each of
    :data:`BUDGET_PRODUCTS`: a residual linear in ``F + 7`` inputs, ``w`` zero at the start
    (the argmax of the log acquisition over the pool). Trained on whole episodes by evolution
    strategies (``benchmarks/ahto_policy/episodes.py``; PGPE, Sehnke et al. 2010).

    Args:
        weights: ``(F + 7,)`` float64; zeros when ``None``.

    Shapes: ``forward(x)``: ``x`` ``(n, F)`` float64 -> ``(n,)`` scores.
    """

    kind = "linear_budget"

    def __init__(self, weights: torch.Tensor | None = None):
        super().__init__()
        n = len(FEATURES) + len(BUDGET_PRODUCTS)
        w = torch.zeros(n, dtype=DTYPE) if weights is None else torch.as_tensor(weights, dtype=DTYPE).reshape(-1)
        if len(w) != n:
            raise ValueError(f"LinearPolicy: {len(w)} weights, expected {n}")
        self.register_buffer("w", w)
        self._cols = [FEATURES.index(k) for k in BUDGET_PRODUCTS]
        self._budget = FEATURES.index("budget_used")

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``(n, F)`` features -> ``(n, F + 7)`` inputs."""
        return torch.cat([x, x[:, self._cols] * x[:, self._budget:self._budget + 1]], -1)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        return self.inputs(x) @ self.w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] + self.residual(x)

    def to_json(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return {"manifest": manifest, "kind": self.kind, "features": list(FEATURES),
                "budget_products": list(BUDGET_PRODUCTS), "weights": self.w.tolist()}

    @classmethod
    def from_json(cls, blob: dict[str, Any]) -> "LinearPolicy":
        """Raises: ValueError: the file's feature lists differ from this module's."""
        if list(blob.get("features", [])) != list(FEATURES) or \
                list(blob.get("budget_products", [])) != list(BUDGET_PRODUCTS):
            raise ValueError(f"policy weights: features {blob.get('features')} / {blob.get('budget_products')} "
                             f"!= {list(FEATURES)} / {list(BUDGET_PRODUCTS)}")
        return cls(torch.tensor(blob["weights"], dtype=DTYPE)).eval()


def load_policy(path: str | Path | None = None) -> PolicyNet | LinearPolicy | None:
    """The shipped policy (``ahto_policy.json`` beside this module), or ``path``; None when the
    default file is absent (a checkout before training).

    Raises:
        FileNotFoundError: an explicit ``path`` that does not exist.
        ValueError: a malformed weights file (names the file).
    """
    p = Path(path) if path is not None else WEIGHTS
    if not p.is_file():
        if path is not None:
            raise FileNotFoundError(f"{p}: no such policy weights file")
        return None
    return _load(str(p.resolve()), p.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> PolicyNet | LinearPolicy:
    """Parsed once per file version: the Optuna sampler rebuilds its searcher on every trial."""
    try:
        blob = json.loads(Path(path).read_text())
        if blob.get("kind") == LinearPolicy.kind:
            return LinearPolicy.from_json(blob)
        return PolicyNet.from_json(blob)
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
        raise ValueError(f"{path}: not a policy weights file ({e})") from e


def candidate_pool(X_opt: torch.Tensor, X_front: torch.Tensor, d: int, *, n_sobol: int, n_perturb: int,
                   scale: float, generator: torch.Generator) -> tuple[torch.Tensor, list[str]]:
    """Unit-cube candidates ``(n, d)`` and their sources: the optimiser's rows ``X_opt``,
    ``n_sobol`` scrambled Sobol points, ``n_perturb`` Gaussian perturbations (std ``scale``)
    of random rows of ``X_front`` and as many of ``X_opt``, clamped to the cube."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    parts, src = [X_opt], ["optimizer"] * len(X_opt)
    if n_sobol:
        parts.append(torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(n_sobol).to(DTYPE))
        src += ["sobol"] * n_sobol
    for base, name in ((X_front, "front_perturbation"), (X_opt, "optimizer_perturbation")):
        if n_perturb and len(base):
            idx = torch.randint(0, len(base), (n_perturb,), generator=generator)
            noise = scale * torch.randn(n_perturb, d, generator=generator, dtype=DTYPE)
            parts.append((base[idx] + noise).clamp(0, 1))
            src += [name] * n_perturb
    return torch.cat(parts), src


def candidate_features(*, log_acq: torch.Tensor, mean: torch.Tensor, sd: torch.Tensor, best: torch.Tensor,
                       y_sd: torch.Tensor, p_feasible: torch.Tensor, X: torch.Tensor, X_obs: torch.Tensor,
                       X_front: torch.Tensor, budget_used: float, sources: Sequence[str]) -> torch.Tensor:
    """The ``(n, F)`` feature matrix of :data:`FEATURES`.

    Args:
        log_acq: ``(n,)`` log acquisition values.
        mean, sd: ``(n, m)`` posterior mean and standard deviation per objective, maximisation
            form (``m`` = 1 or 2; a third objective onward is ignored).
        best: ``(m,)`` best observed value per objective (maximisation form).
        y_sd: ``(m,)`` standard deviation of the observed values per objective (the unit).
        p_feasible: ``(n,)`` probability that the learned constraints hold (ones without any).
        X, X_obs, X_front: ``(n, d)`` candidates, ``(n_obs, d)`` observed, ``(n_front, d)``
            observed Pareto-front points, unit cube.
        budget_used: observations / the search's trial budget, in [0, 1].
        sources: ``n`` names of :data:`SOURCES`.
    """
    n, d = X.shape
    m = min(mean.shape[-1], 2)
    unit = y_sd[:m].clamp_min(1e-12)
    gap = ((mean[:, :m] - best[:m]) / unit).clamp(-10, 10)
    s = (sd[:, :m] / unit).clamp(0, 10)
    obj = torch.zeros(n, 4, dtype=DTYPE)
    obj[:, 0:2 * m:2], obj[:, 1:2 * m:2] = gap, s
    la = log_acq.clamp_min(-1e6)
    top = la.max() if n else torch.tensor(0.0, dtype=DTYPE)
    gap_acq = (la - top).clamp(-30, 0)
    rank = torch.empty(n, dtype=DTYPE)
    rank[torch.argsort(la, descending=True)] = torch.arange(n, dtype=DTYPE) / max(n - 1, 1)

    def nearest(B):
        if not len(B):
            return torch.ones(n, dtype=DTYPE)
        return torch.cdist(X, B).min(-1).values / math.sqrt(d)

    onehot = torch.tensor([[float(src == k) for k in SOURCES] for src in sources], dtype=DTYPE).reshape(n, -1)
    cols = [gap_acq.unsqueeze(-1), rank.unsqueeze(-1), obj, p_feasible.reshape(n, 1),
            nearest(X_obs).unsqueeze(-1), nearest(X_front).unsqueeze(-1),
            torch.full((n, 1), float(budget_used), dtype=DTYPE), onehot]
    return torch.cat(cols, -1)
