"""Model-based searchers: plain qLogNEHVI (``qnehvi``) and AHTO (``ahto``).

Both start with a scrambled Sobol design (Owen scrambling; Sobol 1967) of ``n_init`` configs,
then fit the GP surrogate of :mod:`archsearch.search.gp` to the *unknown* metrics (the quality
objective, learned constraints) with a fidelity input, compute the *known* metrics (FLOPs,
params) with the cost function, and maximise qLogNEHVI with pending trials as ``X_pending``.

* :class:`QNEHVISearcher` proposes the best candidate by acquisition: BoTorch's
  ``optimize_acqf`` restarts (continuous relaxation of the unit cube, then rounded with
  ``space.decode``). Configs already asked and known-infeasible ones are dropped. While no
  observation lies inside the reference box (every objective better than its ``ref``), the
  candidates come from a trust region around the observation nearest to the box (side
  ``trust_length`` of the unit cube) instead of chasing variance across the cube.
* :class:`AHTOSearcher` (docs/design.md "AHTO outer loop") adds the learned policy of
  :mod:`archsearch.search.policy`, and the policy decides: ``n_policy`` samples from the policy
  join the optimiser's candidates, the acquisition ranks them all, and the policy picks one of
  the near-ties at the top (at most ``top_k``, each with at least ``acq_ratio`` of the best
  acquisition value; probability ``pi(c) / sum pi`` over them). Each tell rewards that
  decision with the normalised hypervolume improvement the trial made (REINFORCE, on-policy).
  With ``top_k=1`` AHTO is exactly :class:`QNEHVISearcher` plus policy samples.

Both can be restricted to a fixed set of configurations (:meth:`restrict_configurations`, as
Syne Tune's ``restrict_configurations`` for replay on a recorded table): the Sobol design takes
the unvisited row nearest to each Sobol point, the model phase ranks every unvisited row.
Each ask records in its ``extra`` what proposed the config (``source``: ``sobol``,
``optimizer``, ``policy``, ``trust_region`` or ``table``) and, for AHTO, ``decided_by``.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch

from archsearch.pareto import hypervolume
from archsearch.search.base import KNOWN_COST_METRICS, CostFn, Observation, Searcher
from archsearch.search.policy import FactorisedPolicy

DTYPE = torch.double


class QNEHVISearcher(Searcher):
    """Plain BoTorch qLogNEHVI with a Sobol initial design.

    Args:
        space, seed, cost_fn: see :class:`~archsearch.search.base.Searcher`.
        n_init: Sobol configs before the GP is used (also used while fewer than 2 trials
            finished); default ``min(2 (p + 1), max(2, horizon // 3))`` for ``p`` params
            (not unit-cube columns: a categorical's one-hot columns are one degree of freedom):
            enough to fit a GP, never most of a small budget.
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort (kept small: ask time).
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of the GP fit.
        horizon: trials the search expects (default ``space.budget.trials``; used by AHTO).
        trust_length: side of the trust region (unit cube) used while no observation lies
            inside the reference box.
        max_gp_points: observations the GP is fitted on at most (:meth:`gp_subset`).
    """

    name = "qnehvi"
    supports_restriction = True

    def __init__(self, space, *, seed: int = 0, cost_fn: CostFn | None = None, n_init: int | None = None,
                 num_restarts: int = 2, raw_samples: int = 32, maxiter: int = 15,
                 mc_samples: int = 32, gp_maxiter: int = 60, horizon: int | None = None,
                 trust_length: float = 0.2, max_gp_points: int = 200):
        super().__init__(space, seed=seed, cost_fn=cost_fn)
        budget = getattr(space, "budget", None)
        self.horizon = int(horizon or (budget.trials if budget is not None else 40))
        self.d = len(space.dims())
        n_params = len(space.params)
        self.n_init = int(n_init) if n_init is not None else min(2 * (n_params + 1), max(2, self.horizon // 3))
        self.num_restarts, self.raw_samples, self.maxiter = num_restarts, raw_samples, maxiter
        self.mc_samples, self.gp_maxiter = mc_samples, gp_maxiter
        self.sobol_pos = 0
        self.known_names: list[str] = []
        if cost_fn is not None:
            probe = cost_fn(space.decode([0.5] * self.d))
            self.known_names = [k for k in probe if k in KNOWN_COST_METRICS]
        self.modelled = [m for m in self.metrics if m not in self.known_names]
        self.modelled += [k for k in self.constraints if k not in self.known_names and k not in self.modelled]
        self.known_bounds = {k: b for k, b in self.constraints.items() if k in self.known_names}
        self._known = None
        self.last_info: dict[str, Any] = {}
        self.trust_length = float(trust_length)
        self.max_gp_points = int(max_gp_points)
        self.table: list[dict[str, Any]] | None = None
        self._table_X: torch.Tensor | None = None  # (rows, d)
        self._table_ok: list[bool] = []

    # ------------------------------------------------------------------ restriction
    def restrict_configurations(self, configs) -> None:
        """Propose only configs of ``configs`` (each at most once); see the module docstring."""
        self.table = [dict(c) for c in configs]
        self._table_X = torch.tensor([self.space.encode(c) for c in self.table], dtype=DTYPE)
        self._table_ok = [self.known_feasible(c) for c in self.table]

    def _unseen(self, X: torch.Tensor) -> torch.Tensor:
        """``(n,)`` bool: rows of ``X`` (n, d) not equal to an asked config's encoding."""
        seen = [o.x for o in self.observations if o.x is not None] + [p["x"] for p in self.pending.values()]
        if not seen or not len(X):
            return torch.ones(len(X), dtype=torch.bool)
        dist = torch.cdist(X, torch.tensor(seen, dtype=DTYPE), compute_mode="donot_use_mm_for_euclid_dist")
        return dist.min(-1).values > 1e-9  # exact distances: the matmul form gives ~1e-8 for equal rows

    def _table_rows(self) -> list[int]:
        """Indices of the table's unvisited, known-feasible rows.

        Raises:
            RuntimeError: every row was visited.
        """
        fresh = self._unseen(self._table_X)
        rows = [i for i in range(len(self.table)) if fresh[i] and self._table_ok[i]]
        if not rows:
            raise RuntimeError("every configuration of the table has been asked")
        return rows

    # ------------------------------------------------------------------ suggest
    def _suggest(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        with torch.random.fork_rng():
            torch.manual_seed(zlib.crc32(f"{self.seed}:{self.n_asked}".encode()))
            usable = [o for o in self.finished() if all(k in o.metrics for k in self.modelled)]
            if self.n_asked < self.n_init or len(usable) < 2:
                return self._sobol(), {"source": "sobol"}
            return self._model_suggest(usable)

    def _sobol(self) -> dict[str, Any]:
        engine = torch.quasirandom.SobolEngine(self.d, scramble=True, seed=self.seed)
        engine.fast_forward(self.sobol_pos)
        if self.table is not None:  # the unvisited row nearest to the next Sobol point
            rows = self._table_rows()
            x = engine.draw(1).double()
            self.sobol_pos += 1
            dist = torch.cdist(x, self._table_X[rows], compute_mode="donot_use_mm_for_euclid_dist")
            return dict(self.table[rows[int(dist[0].argmin())]])
        for _ in range(1000):
            x = engine.draw(1).double()[0].tolist()
            self.sobol_pos += 1
            cfg = self.space.decode(x)
            if self.known_feasible(cfg):
                return cfg
        return cfg  # no known-feasible point in 1000 draws: the constraint region is tiny

    def ref_point(self, obs: list[Observation]) -> list[float]:
        """Reference point (maximisation form): the objective's ``ref``, else worst - 10% range."""
        out = []
        for j, (k, s, r) in enumerate(zip(self.metrics, self.signs, self.refs)):
            if r is not None:
                out.append(s * r)
                continue
            vals = [s * o.metrics[k] for o in obs if k in o.metrics]
            lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
            out.append(lo - 0.1 * (hi - lo) - 1e-9 * max(1.0, abs(lo)))
        return out

    def gp_subset(self, obs: list[Observation]) -> list[Observation]:
        """The observations the GP is fitted on: all of them up to ``max_gp_points``; beyond,
        an approximation that keeps the cost of an ask bounded: half from the best
        non-dominated layers (observed objective values, non-dominated sorting as in NSGA-II,
        Deb et al. 2002) and the rest the most recent ones."""
        if len(obs) <= self.max_gp_points:
            return obs
        from botorch.utils.multi_objective.pareto import is_non_dominated

        Y = torch.tensor([self.objective_values(o.metrics) for o in obs], dtype=DTYPE)
        left, chosen = list(range(len(obs))), []
        while left and len(chosen) < self.max_gp_points // 2:
            nd = is_non_dominated(Y[left], deduplicate=False).tolist()
            layer = [i for i, keep in zip(left, nd) if keep]
            chosen += layer[:self.max_gp_points // 2 - len(chosen)]
            left = [i for i, keep in zip(left, nd) if not keep]
        taken = set(chosen)
        for i in reversed(range(len(obs))):
            if len(chosen) >= self.max_gp_points:
                break
            if i not in taken:
                chosen.append(i)
        return [obs[i] for i in sorted(chosen)]

    def _acquisition(self, obs: list[Observation]):
        from archsearch.search import gp

        obs = self.gp_subset(obs)

        fid = any(o.fidelity < 1.0 for o in obs)
        X = torch.tensor([o.x for o in obs], dtype=DTYPE)  # (n, d)
        Xin = torch.cat([X, torch.tensor([[o.fidelity] for o in obs], dtype=DTYPE)], -1) if fid else X
        Y = torch.tensor([[o.metrics[k] for k in self.modelled] for o in obs], dtype=DTYPE)  # (n, k)
        model = gp.fit_gp(Xin, Y, maxiter=self.gp_maxiter)
        if self.known_names and self._known is None:
            self._known = gp._KnownMetrics(self.space.decode, self.cost_fn, self.known_names, self.d)
        outputs = []
        for k, s in zip(self.metrics, self.signs):
            outputs.append(("known", self.known_names.index(k), s) if k in self.known_names
                           else ("model", self.modelled.index(k), s))
        learned = [(self.modelled.index(k), lo, hi) for k, (lo, hi) in self.constraints.items()
                   if k in self.modelled]
        full = [o for o in obs if o.fidelity >= 1.0] or obs
        Xb = torch.tensor([o.x for o in full], dtype=DTYPE)
        Xp = torch.tensor([p["x"] for p in self.pending.values()], dtype=DTYPE) if self.pending else None
        ref = self.ref_point(full)
        acqf = gp.make_acquisition(
            model, X_baseline=Xb, ref_point=ref, outputs=outputs, learned_constraints=learned,
            known=self._known, known_bounds=self.known_bounds, X_pending=Xp, d=self.d,
            fidelity=fid, mc_samples=self.mc_samples,
            seed=zlib.crc32(f"acq:{self.seed}:{self.n_asked}".encode()))
        return model, acqf, fid

    def _optimiser_candidates(self, acqf, bounds: torch.Tensor | None = None) -> torch.Tensor:
        """``optimize_acqf`` restarts within ``bounds`` (2, d; default the unit cube): (restarts, d)."""
        from botorch.optim import optimize_acqf

        if bounds is None:
            bounds = torch.stack([torch.zeros(self.d, dtype=DTYPE), torch.ones(self.d, dtype=DTYPE)])
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            X, _ = optimize_acqf(acqf, bounds=bounds, q=1, num_restarts=self.num_restarts,
                                 raw_samples=self.raw_samples, return_best_only=False,
                                 options={"maxiter": self.maxiter, "batch_limit": self.num_restarts})
        return X.reshape(-1, self.d)  # (num_restarts, d)

    def _round(self, X: torch.Tensor) -> tuple[list[dict], torch.Tensor]:
        cfgs = [self.space.decode(x) for x in X.tolist()]
        return cfgs, torch.tensor([self.space.encode(c) for c in cfgs], dtype=DTYPE)

    def trust_region(self, obs: list[Observation]) -> torch.Tensor | None:
        """``(2, d)`` bounds around the observation nearest to the reference box while none is
        inside it (every objective better than its ``ref``); None once one is, or without refs."""
        if any(r is None for r in self.refs):
            return None
        ref = self.ref_point(obs)
        ys = [self.objective_values(o.metrics) for o in obs if self.feasible(o.metrics)]
        if not ys or any(all(y > r for y, r in zip(v, ref)) for v in ys):
            return None
        scale = [max(max(v[j] for v in ys) - min(v[j] for v in ys), 1e-12) for j in range(len(ref))]
        feas = [o for o in obs if self.feasible(o.metrics)]
        gap = [sum(max(r - y, 0.0) / sc for y, r, sc in zip(self.objective_values(o.metrics), ref, scale))
               for o in feas]
        x = torch.tensor(feas[min(range(len(feas)), key=gap.__getitem__)].x, dtype=DTYPE)
        half = self.trust_length / 2
        return torch.stack([(x - half).clamp(0, 1), (x + half).clamp(0, 1)])

    def _candidates(self, acqf, obs: list[Observation]) -> tuple[list[dict], torch.Tensor, list[str]]:
        """Candidate configs, their encodings (n, d) and what proposed each."""
        if self.table is not None:
            rows = self._table_rows()
            return [dict(self.table[i]) for i in rows], self._table_X[rows], ["table"] * len(rows)
        tr = self.trust_region(obs)
        cfgs, Xc = self._round(self._optimiser_candidates(acqf, tr))
        sources = ["optimizer"] * len(cfgs)
        if tr is not None:  # and uniform points of the region itself
            g = torch.Generator().manual_seed(zlib.crc32(f"tr:{self.seed}:{self.n_asked}".encode()))
            U = tr[0] + (tr[1] - tr[0]) * torch.rand(max(self.raw_samples, 16), self.d, generator=g, dtype=DTYPE)
            c2, X2 = self._round(U)
            cfgs, Xc, sources = cfgs + c2, torch.cat([Xc, X2]), sources + ["trust_region"] * len(c2)
        return cfgs, Xc, sources

    def _ranked(self, acqf, cfgs: list[dict], Xc: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """Indices of the usable candidates (not asked before, not known-infeasible, no
        duplicate encodings) sorted by acquisition value, best first, and those values."""
        from archsearch.search import gp

        fresh = self._unseen(Xc)
        keep, keys = [], set()
        for i, c in enumerate(cfgs):
            key = tuple(round(v, 9) for v in Xc[i].tolist())
            if fresh[i] and key not in keys and self.known_feasible(c):
                keys.add(key)
                keep.append(i)
        if not keep:
            return [], torch.zeros(0, dtype=DTYPE)
        vals = gp.score(acqf, Xc[keep])
        order = torch.argsort(vals, descending=True)
        return [keep[int(j)] for j in order], vals[order]

    def _model_suggest(self, obs):
        _, acqf, _ = self._acquisition(obs)
        cfgs, Xc, sources = self._candidates(acqf, obs)
        ranked, vals = self._ranked(acqf, cfgs, Xc)
        if not ranked:  # nothing usable: fall back to the Sobol design (which checks)
            return self._sobol(), {"source": "sobol"}
        best = ranked[0]
        self.last_info = {"n_candidates": len(ranked), "best_source": sources[best],
                          "best_value": float(vals[0])}
        return cfgs[best], {"source": sources[best]}

    # ------------------------------------------------------------------ state
    def _state(self) -> Any:
        return {"sobol_pos": self.sobol_pos}

    def _load_state(self, state: Any) -> None:
        self.sobol_pos = int(state["sobol_pos"])


class AHTOSearcher(QNEHVISearcher):
    """AHTO: the qLogNEHVI searcher plus a REINFORCE-trained policy that decides among the
    acquisition's top candidates (see the module docstring).

    Args:
        n_policy: candidates sampled from the policy per ask (the policy state's "budget
            used" is ``observations / horizon``).
        top_k, acq_ratio: the policy chooses among at most ``top_k`` of the best candidates
            by acquisition, those whose acquisition value is at least ``acq_ratio`` times the
            best one's (it decides where the acquisition is nearly indifferent).
        bins, hidden, policy_lr, entropy, rho: see :class:`~archsearch.search.policy.FactorisedPolicy`.
        Other arguments: see :class:`QNEHVISearcher`.
    """

    name = "ahto"

    def __init__(self, space, *, seed: int = 0, cost_fn: CostFn | None = None, n_policy: int = 128,
                 top_k: int = 5, acq_ratio: float = 0.5, bins: int = 8, hidden: int = 64, policy_lr: float = 0.01,
                 entropy: float = 0.01, rho: float = 0.9, **kwargs):
        super().__init__(space, seed=seed, cost_fn=cost_fn, **kwargs)
        self.n_policy, self.top_k, self.acq_ratio = int(n_policy), int(top_k), float(acq_ratio)
        self.policy = FactorisedPolicy(space, bins=bins, hidden=hidden, lr=policy_lr,
                                       entropy=entropy, rho=rho, seed=seed)
        self.rewards: list[float] = []

    # ------------------------------------------------------------------ state vector
    def _hv(self, obs: list[Observation], ref: list[float]) -> float:
        ys = [self.objective_values(o.metrics) for o in obs if self.feasible(o.metrics)]
        return hypervolume(ys, ["max"] * len(ref), ref)  # ys, ref in maximisation form

    def _box(self, obs: list[Observation], ref: list[float]) -> float:
        ys = [self.objective_values(o.metrics) for o in obs]
        if not ys:
            return 1.0
        ideal = [max(y[j] for y in ys) for j in range(len(ref))]
        return math.prod(max(i - r, 1e-12) for i, r in zip(ideal, ref))

    def policy_state(self, model=None, obs: list[Observation] | None = None) -> list[float]:
        """``STATE_DIM`` features: incumbent GP mean and std of the first modelled metric
        (standardised), budget used, last reward, mean of the last 5 rewards, normalised HV."""
        obs = obs if obs is not None else self.finished()
        mean = std = 0.0
        if model is not None and obs and self.modelled:
            k = self.modelled[0]
            s = self.signs[self.metrics.index(k)] if k in self.metrics else 1.0
            ys = torch.tensor([s * o.metrics[k] for o in obs], dtype=DTYPE)
            best = obs[int(torch.argmax(ys))]
            sub = model.models[0] if hasattr(model, "models") else model
            x = list(best.x) + ([1.0] if sub.train_inputs[0].shape[-1] > self.d else [])
            with torch.no_grad():
                post = sub.posterior(torch.tensor([x], dtype=DTYPE))
            mu, sd = float(post.mean.squeeze()), float(post.variance.clamp_min(0).sqrt().squeeze())
            scale = float(ys.std()) if len(ys) > 1 and float(ys.std()) > 0 else 1.0
            mean, std = (s * mu - float(ys.mean())) / scale, sd / scale
        r = self.rewards
        ref = self.ref_point(obs) if obs else None
        nhv = self._hv(obs, ref) / self._box(obs, ref) if obs else 0.0
        return [mean, std, len(obs) / max(self.horizon, 1), r[-1] if r else 0.0,
                sum(r[-5:]) / max(len(r[-5:]), 1), nhv]

    # ------------------------------------------------------------------ suggest / observe
    def _suggest(self, trial_id: str):
        with torch.random.fork_rng():
            torch.manual_seed(zlib.crc32(f"{self.seed}:{self.n_asked}".encode()))
            usable = [o for o in self.finished() if all(k in o.metrics for k in self.modelled)]
            if self.n_asked < self.n_init or len(usable) < 2:
                return self._sobol(), {"source": "sobol", "state": self.policy_state(None, usable)}
            model, acqf, _ = self._acquisition(usable)
            state = self.policy_state(model, usable)
            cfgs, Xc, sources = self._candidates(acqf, usable)
            if self.table is None and self.trust_region(usable) is None:
                pcfgs, _ = self.policy.sample(state, self.n_policy)
                pX = torch.tensor([self.space.encode(c) for c in pcfgs], dtype=DTYPE)
                cfgs, Xc, sources = cfgs + pcfgs, torch.cat([Xc, pX]), sources + ["policy"] * len(pcfgs)
            ranked, vals = self._ranked(acqf, cfgs, Xc)
            if not ranked:
                return self._sobol(), {"source": "sobol", "state": state}
            # near-ties only: the candidates whose acquisition value is at least acq_ratio of
            # the best (values are log-acquisition: qLogNEHVI / qLogNEI)
            floor = float(vals[0]) + math.log(self.acq_ratio)
            top = [i for i, v in zip(ranked[:self.top_k], vals[:self.top_k].tolist()) if v >= floor]
            acts = [self.policy.actions_of(cfgs[i]) for i in top]
            q = self.policy.choice_probs(state, acts)
            c = int(torch.multinomial(q, 1, generator=self.policy.gen))
            pick = top[c]
            self.last_info = {"n_candidates": len(ranked), "best_source": sources[ranked[0]],
                              "best_value": float(vals[0]), "chosen_rank": c,
                              "chosen_prob": float(q[c])}
            return cfgs[pick], {"source": sources[pick], "decided_by": "policy", "state": state,
                                "candidates": acts, "chosen": c}

    def _observe(self, obs: Observation) -> None:
        if "state" not in obs.extra:
            return
        reward = 0.0
        if obs.ok:
            prev = [o for o in self.finished() if o is not obs]
            ref = self.ref_point(prev + [obs])
            reward = (self._hv(prev + [obs], ref) - self._hv(prev, ref)) / self._box(prev + [obs], ref)
        self.rewards.append(reward)
        if "candidates" in obs.extra:  # the policy decided this trial: learn from it (on-policy)
            with torch.random.fork_rng():
                self.policy.update_choice(obs.extra["state"], obs.extra["candidates"],
                                          obs.extra["chosen"], reward)

    # ------------------------------------------------------------------ state
    def _state(self) -> Any:
        return {**super()._state(), "policy": self.policy.get_state(), "rewards": list(self.rewards)}

    def _load_state(self, state: Any) -> None:
        super()._load_state(state)
        self.policy.set_state(state["policy"])
        self.rewards = list(state["rewards"])


def make_model_based(name: str, space, *, seed: int = 0, cost_fn: CostFn | None = None,
                     **kwargs) -> Searcher:
    """``"ahto"`` or ``"qnehvi"``.

    Raises:
        ValueError: another name.
    """
    if name == "ahto":
        return AHTOSearcher(space, seed=seed, cost_fn=cost_fn, **kwargs)
    if name == "qnehvi":
        return QNEHVISearcher(space, seed=seed, cost_fn=cost_fn, **kwargs)
    raise ValueError(f"unknown model-based searcher {name!r}")
