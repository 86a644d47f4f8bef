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
* :class:`AHTOSearcher` adds the meta-trained acquisition policy of
  :mod:`archsearch.search.policy`: a wider candidate pool re-scored from dimension-free features.

Both can be restricted to a fixed set of configurations (:meth:`restrict_configurations`, as
Syne Tune's ``restrict_configurations`` for replay on a recorded table): the Sobol design takes
the unvisited row nearest to each Sobol point, the model phase ranks every unvisited row.
Each ask records in its ``extra`` what proposed the config (``source``: ``sobol``,
``optimizer``, ``trust_region`` or ``table``).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

import torch

from archsearch.search.base import KNOWN_COST_METRICS, CostFn, Observation, Searcher

DTYPE = torch.double
#: what can propose a model-based ask (``extra["source"]``): the acquisition optimiser, the trust
#: region, uniform points, a replay table, and the AHTO policy's pool (``pool_*``)
MODEL_SOURCES = frozenset({"optimizer", "trust_region", "uniform", "table", "pool_sobol",
                           "pool_front_perturbation", "pool_optimizer_perturbation"})


class QNEHVISearcher(Searcher):
    """Plain BoTorch qLogNEHVI with a Sobol initial design.

    Args:
        space, seed, cost_fn: see :class:`~archsearch.search.base.Searcher`.
        n_init: Sobol configs before the GP is used (also used while fewer than 2 trials
            finished); default ``min(2 (p + 1), max(2, horizon // 3))`` for ``p`` params
            (not unit-cube columns: a categorical's one-hot columns are one degree of freedom):
            enough to fit a GP, never most of a small budget.
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort (kept small: ask time).
        acqf_retry: let ``optimize_acqf`` restart from new initial conditions when L-BFGS-B
            warns (``retry_on_optimization_warning``). A restart that stops at this small
            ``maxiter`` is an ``OptimizationWarning`` to BoTorch, and the retry then doubles the
            optimiser's time and discards the first attempt. Default off: in
            ``benchmarks/searchers/results/acqf_retry.json`` the 160 LCBench searches were
            identical either way (the retry never fired there); it fires on some asks of a
            100-observation default-space history, where it costs about 0.2 s.
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of the GP fit.
        horizon: trials the search expects (default ``space.budget.trials``; used by AHTO).
        trust_length: side of the trust region (unit cube) used while no observation lies
            inside the reference box.
        max_gp_points: observations the GP is fitted on at most (:meth:`gp_subset`).
        initial_configs: configs the initial design proposes first, in order (a warm start,
            as Optuna's ``enqueue_trial``: e.g. configs that did well on related tasks); the
            Sobol design fills the rest of ``n_init``.
        noise_floor, output_scale: the GP's noise floor and learned output scale
            (:func:`archsearch.search.gp.fit_gp`).
        log_costs: model a minimised objective whose observed values are all positive (a
            time, a loss) as its logarithm.
        history: earlier searches of related tasks (Optuna studies, or lists of ``{"config",
            "metrics"}`` rows; :func:`archsearch.search.transfer.history_tasks`): a
            Gaussian-copula prior (:class:`~archsearch.search.transfer.CopulaPrior`) becomes
            the GP's mean for the objectives the history holds, and the initial design comes
            from the prior (after ``initial_configs``).
        history_mean: use the prior as the GP's mean (``False``: the prior gives the initial
            design only and the GP models the raw values, as without history).
        history_design: how the prior chooses the initial design
            (:meth:`~archsearch.search.transfer.CopulaPrior.design`: ``"mean"`` or ``"setcover"``).
        history_design_share: the share of ``n_init`` the prior chooses (rounded up); Sobol
            points fill the rest (a hedge against history that does not transfer).
    """

    name = "qnehvi"
    supports_restriction = True

    def __init__(self, space, *, seed: int = 0, cost_fn: CostFn | None = None, n_init: int | None = None,
                 num_restarts: int = 2, raw_samples: int = 32, maxiter: int = 15,
                 mc_samples: int = 32, gp_maxiter: int = 60, horizon: int | None = None,
                 trust_length: float = 0.2, max_gp_points: int = 200,
                 initial_configs: list[dict] | None = None, noise_floor: float = 1e-4,
                 output_scale: bool = False, log_costs: bool = False, history=None,
                 history_mean: bool = True, history_design: str = "mean", history_design_share: float = 1.0,
                 acqf_retry: bool = False):
        super().__init__(space, seed=seed, cost_fn=cost_fn)
        self.acqf_retry = bool(acqf_retry)
        self.history_mean = bool(history_mean)
        self.initial_configs = [dict(c) for c in initial_configs or []]
        self.noise_floor, self.output_scale, self.log_costs = float(noise_floor), bool(output_scale), bool(log_costs)
        self.initial_used = 0
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
        self.prior = None
        self.prior_weight: dict[str, float] = {}
        #: the modelled objectives (what a transfer prior can model)
        self.prior_metrics = [k for k in self.metrics if k in self.modelled and k not in self.constraints]
        if history:
            from archsearch.search import transfer

            if isinstance(history, transfer.CopulaPrior):  # fitted already (a sampler's cache)
                self.prior = history
            else:
                self.prior = transfer.CopulaPrior(
                    space, history, self.prior_metrics,
                    [self.signs[self.metrics.index(k)] for k in self.prior_metrics], seed=seed)
                transfer.warn_ignored(self.prior)
            k = math.ceil(self.n_init * float(history_design_share) - 1e-9)
            self.initial_configs += self.prior.design(space, k, seed=seed, feasible=self.known_feasible,
                                                      method=history_design)

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
            usable = self.modelled_observations()
            if self.n_asked < self.n_init or len(usable) < 2:
                return self._sobol(), {"source": "sobol"}
            return self._model_suggest(usable)

    def modelled_observations(self) -> list[Observation]:
        """The finished observations the model is fitted on, every modelled value finite.

        A NaN modelled value (a Tune result's ``val_loss``) drops the observation: it would put
        NaN into the GP fit and every later ask would raise. So does an infinite value of a
        constrained metric (Optuna's ``set_constraint`` takes inf; an objective that is also
        constrained): clipped, it could look feasible; such a trial still counts as infeasible
        on the front. An infinite objective (an objective that returns ``inf`` for a diverged
        configuration) is clipped to the finite range observed for that objective, as Optuna's
        ``GPSampler`` does (``optuna._gp``) once a finite value exists (before, nothing is
        modelled): the region is then learned as the worst seen, not ignored (dropping it kept
        the model proposing there). The clipped observations are copies: the recorded ones
        keep their values.
        """
        clip = [k for k in self.modelled if k in self.metrics and k not in self.constraints]
        obs = [o for o in self.finished()
               if all(k in o.metrics and (not math.isnan(o.metrics[k]) if k in clip else math.isfinite(o.metrics[k]))
                      for k in self.modelled)]
        span = {}
        for k in clip:
            finite = [o.metrics[k] for o in obs if math.isfinite(o.metrics[k])]
            if not finite:
                return []  # nothing to clip to: no model yet
            span[k] = (min(finite), max(finite))
        return [o if all(math.isfinite(o.metrics[k]) for k in clip) else dataclasses.replace(
                    o, metrics={**o.metrics, **{k: min(max(o.metrics[k], span[k][0]), span[k][1]) for k in clip}})
                for o in obs]

    def _sobol(self) -> dict[str, Any]:
        if self.initial_used < len(self.initial_configs):
            self.initial_used += 1
            return dict(self.initial_configs[self.initial_used - 1])
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

    def _modelled_outcomes(self, obs: list[Observation]) -> tuple[torch.Tensor, dict[str, float], dict[str, str]]:
        """The GP's outcomes ``(n, k)`` for the modelled metrics of ``obs``, each objective's
        sign in the acquisition and how each objective was transformed (``copula``: the
        transfer prior's copula values, maximisation form, sign +1; ``log``: ``log_costs``)."""
        from archsearch.search import transfer

        cols, signs, how = [], {}, {}
        for k in self.modelled:
            y = torch.tensor([o.metrics[k] for o in obs], dtype=DTYPE)
            s = self.signs[self.metrics.index(k)] if k in self.metrics else 1.0
            signs[k] = s
            if k in self.metrics and k not in self.constraints:
                if (self.prior is not None and self.history_mean
                        and self.prior_metrics.index(k) in self.prior.objectives):
                    y, signs[k], how[k] = transfer.copula(s * y), 1.0, "copula"
                elif self.log_costs and s < 0 and bool((y > 0).all()):
                    y, how[k] = y.log(), "log"
            cols.append(y)
        return torch.stack(cols, -1), signs, how

    def _acquisition(self, obs: list[Observation]):
        from archsearch.search import gp

        obs = self.gp_subset(obs)

        fid = any(o.fidelity < 1.0 for o in obs)
        X = torch.tensor([o.x for o in obs], dtype=DTYPE)  # (n, d)
        Xin = torch.cat([X, torch.tensor([[o.fidelity] for o in obs], dtype=DTYPE)], -1) if fid else X
        Y, msign, how = self._modelled_outcomes(obs)  # (n, k)
        means = None
        if self.prior is not None:
            from archsearch.search import transfer

            means = {self.modelled.index(k): transfer.prior_mean(
                self.prior, self.prior.objectives.index(self.prior_metrics.index(k)))
                for k, h in how.items() if h == "copula"}
        model = gp.fit_gp(Xin, Y, maxiter=self.gp_maxiter, noise_floor=self.noise_floor,
                          output_scale=self.output_scale, means=means)
        if self.known_names and self._known is None:
            self._known = gp._KnownMetrics(self.space.decode, self.cost_fn, self.known_names, self.d)
        outputs = []
        for k, s in zip(self.metrics, self.signs):
            outputs.append(("known", self.known_names.index(k), s) if k in self.known_names
                           else ("model", self.modelled.index(k), msign[k]))
        learned = [(self.modelled.index(k), lo, hi) for k, (lo, hi) in self.constraints.items()
                   if k in self.modelled]
        full_idx = [i for i, o in enumerate(obs) if o.fidelity >= 1.0] or list(range(len(obs)))
        full = [obs[i] for i in full_idx]
        Xb = torch.tensor([o.x for o in full], dtype=DTYPE)
        Xp = torch.tensor([p["x"] for p in self.pending.values()], dtype=DTYPE) if self.pending else None
        ref = self.ref_point(full)
        for j, k in enumerate(self.metrics):  # a transformed objective: its reference from the data
            if k in how:
                if how[k] == "log" and self.refs[j] is not None and self.refs[j] > 0:
                    ref[j] = -math.log(self.refs[j])
                    continue
                v = msign[k] * Y[full_idx, self.modelled.index(k)]
                lo, hi = float(v.min()), float(v.max())
                ref[j] = lo - 0.1 * (hi - lo) - 1e-9 * max(1.0, abs(lo))
        acqf = gp.make_acquisition(
            model, X_baseline=Xb, ref_point=ref, outputs=outputs, learned_constraints=learned,
            known=self._known, known_bounds=self.known_bounds, X_pending=Xp, d=self.d,
            fidelity=fid, mc_samples=self.mc_samples,
            seed=zlib.crc32(f"acq:{self.seed}:{self.n_asked}".encode()))
        if means:  # the learned weight of the prior in each GP mean (0: the prior is ignored)
            self.prior_weight = {
                k: float((model.models[i] if hasattr(model, "models") else model).mean_module.weight.detach())
                for k, i in ((k, self.modelled.index(k)) for k, h in how.items() if h == "copula")}
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
                                 retry_on_optimization_warning=self.acqf_retry,
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
        if not ranked:  # in a small space the rounded candidates can all be configs already
            # asked: the acquisition ranks uniform points of the whole cube instead
            g = torch.Generator().manual_seed(zlib.crc32(f"uniform:{self.seed}:{self.n_asked}".encode()))
            cfgs, Xc = self._round(torch.rand(max(self.raw_samples, 64), self.d, generator=g, dtype=DTYPE))
            sources = ["uniform"] * len(cfgs)
            ranked, vals = self._ranked(acqf, cfgs, Xc)
        if not ranked:  # nothing usable: fall back to the Sobol design (which checks)
            return self._sobol(), {"source": "sobol"}
        best = ranked[0]
        self.last_info = {"n_candidates": len(ranked), "best_source": sources[best],
                          "best_value": float(vals[0]), "prior_weight": dict(self.prior_weight)}
        return cfgs[best], {"source": sources[best]}

    # ------------------------------------------------------------------ state
    def _state(self) -> Any:
        return {"sobol_pos": self.sobol_pos, "initial_used": self.initial_used}

    def _load_state(self, state: Any) -> None:
        self.sobol_pos = int(state["sobol_pos"])
        self.initial_used = int(state.get("initial_used", 0))


class AHTOSearcher(QNEHVISearcher):
    """AHTO: qLogNEHVI (qLogNEI for one objective) plus the meta-trained acquisition policy of
    :mod:`archsearch.search.policy`.

    Each model-based ask fits the same GP and acquisition as :class:`QNEHVISearcher`, then
    builds a wider pool of candidates (the ``optimize_acqf`` restarts, ``n_sobol`` Sobol points,
    ``n_perturb`` perturbations of the front and of the restarts), computes each candidate's
    dimension-free features (GP posterior mean gap and standard deviation per objective, log
    acquisition and its rank, probability of feasibility, distances to observed and front
    points, budget used) and proposes the candidate the policy scores highest. The policy is a
    residual on the log acquisition, meta-trained across LCBench tasks
    (``benchmarks/ahto_policy/ahto_policy.py``; weights and manifest in ``ahto_policy.json``); an untrained
    (zero) residual is "argmax of the log acquisition over the pool". The ask's ``extra`` says
    ``decided_by: meta_policy`` and whether the policy's choice differs from the acquisition's
    (``policy_changed``).

    Measured (``benchmarks/searchers/lcbench.py``, LCBench test tasks never seen in training or selection,
    2 objectives, 20 trials, 20 seeds per task): the policy cut qLogNEHVI's hypervolume regret on
    the 4 validation tasks it was chosen on; on the 10 test tasks it does not (median ratio of
    regrets ahto/qnehvi 1.02, Wilcoxon p 0.92, worse on 6 of 10), and both stay behind Optuna's
    ``GPSampler``; numbers in ``benchmarks/searchers/results/searchers.json``. On the branched
    problem of ``benchmarks/searchers/conditional.py`` the policy is what puts AHTO level with
    TPE: without it (``policy="none"``) AHTO falls well below TPE, which is why it stays on by
    default. A second design, a :class:`~archsearch.search.policy.LinearPolicy` trained on whole
    episodes by evolution strategies (``benchmarks/ahto_policy/episodes.py``, opt-in with
    ``policy="benchmarks/ahto_policy/weights/ahto_policy_es.json"``), tied this one on the
    validation tasks; numbers in ``benchmarks/ahto_policy/results/ahto_policy_episodes.json``. An earlier policy
    (REINFORCE from scratch inside each run, choosing among near-ties) was removed because it
    never beat plain qLogNEHVI (``benchmarks/searchers/searchers.py``: Wilcoxon p >= 0.07 everywhere).

    With ``history`` (a transfer prior) the policy is switched off, being outside what it was
    trained on: the acquisition decides and each ask's ``extra`` says ``policy_off: history``.

    Args:
        space, seed, cost_fn, and the rest: as :class:`QNEHVISearcher`.
        policy: path of a weights file; ``None`` (default) the shipped one; ``"none"`` no policy
            (then the searcher is :class:`QNEHVISearcher` exactly).
        n_sobol: Sobol points added to the pool (unit cube).
        n_perturb: perturbations of front points, and as many of the optimiser's restarts.
        perturb_scale: standard deviation of a perturbation (unit cube).
        record_pool: keep the last pool's configs, features and choice in ``last_pool``
            (policy training).

    Raises:
        FileNotFoundError, ValueError: an explicit ``policy`` file that is missing or malformed.
    """

    name = "ahto"

    def __init__(self, space, *, seed: int = 0, cost_fn: CostFn | None = None, n_init: int | None = None,
                 num_restarts: int = 2, raw_samples: int = 32, maxiter: int = 15, mc_samples: int = 32,
                 gp_maxiter: int = 60, horizon: int | None = None, trust_length: float = 0.2,
                 max_gp_points: int = 200, initial_configs: list[dict] | None = None,
                 noise_floor: float = 1e-4, output_scale: bool = False, log_costs: bool = False,
                 history=None, history_mean: bool = True, history_design: str = "mean",
                 history_design_share: float = 1.0, policy: str | None = None,
                 n_sobol: int = 64, n_perturb: int = 16,
                 perturb_scale: float = 0.1, record_pool: bool = False, acqf_retry: bool = False):
        super().__init__(space, seed=seed, cost_fn=cost_fn, n_init=n_init, num_restarts=num_restarts,
                         raw_samples=raw_samples, maxiter=maxiter, mc_samples=mc_samples,
                         gp_maxiter=gp_maxiter, horizon=horizon, trust_length=trust_length,
                         max_gp_points=max_gp_points, initial_configs=initial_configs,
                         noise_floor=noise_floor, output_scale=output_scale, log_costs=log_costs,
                         history=history, history_mean=history_mean, history_design=history_design,
                         history_design_share=history_design_share, acqf_retry=acqf_retry)
        from archsearch.search import policy as pol

        self.policy = None if policy == "none" else pol.load_policy(policy)
        self.n_sobol, self.n_perturb, self.perturb_scale = int(n_sobol), int(n_perturb), float(perturb_scale)
        self.record_pool = bool(record_pool)
        self.last_pool: dict[str, Any] | None = None

    def _pool_posterior(self, model, X: torch.Tensor, fid: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One posterior over the pool ``X`` (n, d): ``(n, m)`` mean and standard deviation of
        each objective, maximisation form (a known metric: its value, standard deviation 0), and
        ``(n,)`` the probability that every learned constraint holds (independent Gaussians)."""
        Xin = torch.cat([X, torch.ones(len(X), 1, dtype=DTYPE)], -1) if fid else X
        with torch.no_grad():
            post = model.posterior(Xin)
        mu = post.mean.reshape(len(X), -1)  # (n, k_model)
        sd = post.variance.reshape(len(X), -1).clamp_min(0).sqrt()
        cols_m, cols_s = [], []
        K = self._known(X) if self.known_names else None
        for k, sign in zip(self.metrics, self.signs):
            if k in self.known_names:
                cols_m.append(sign * K[:, self.known_names.index(k)])
                cols_s.append(torch.zeros(len(X), dtype=DTYPE))
            else:
                j = self.modelled.index(k)
                cols_m.append(sign * mu[:, j])
                cols_s.append(sd[:, j])
        p = torch.ones(len(X), dtype=DTYPE)
        normal = torch.distributions.Normal(torch.zeros((), dtype=DTYPE), torch.ones((), dtype=DTYPE))
        for k, (lo, hi) in self.constraints.items():
            if k not in self.modelled:
                continue
            j = self.modelled.index(k)
            s = sd[:, j].clamp_min(1e-9)
            if hi is not None:
                p = p * normal.cdf((hi - mu[:, j]) / s)
            if lo is not None:
                p = p * normal.cdf((mu[:, j] - lo) / s)
        return torch.stack(cols_m, -1), torch.stack(cols_s, -1), p

    def _model_suggest(self, obs):
        if self.prior is not None and self.policy is not None:
            # outside the policy's training distribution (it never saw a transfer prior's
            # copula outputs): the acquisition decides, and the ask says so
            cfg, extra = super()._model_suggest(obs)
            return cfg, {**extra, "decided_by": "acquisition", "policy_off": "history"}
        if self.policy is None and not self.record_pool or self.table is not None:
            return super()._model_suggest(obs)
        from botorch.utils.multi_objective.pareto import is_non_dominated

        from archsearch.search import policy as pol

        model, acqf, fid = self._acquisition(obs)
        X_opt = self._optimiser_candidates(acqf, self.trust_region(obs))
        feas = [o for o in obs if self.feasible(o.metrics)] or obs
        Y = torch.tensor([self.objective_values(o.metrics) for o in feas], dtype=DTYPE)
        X_obs = torch.tensor([o.x for o in obs], dtype=DTYPE)
        X_front = torch.tensor([o.x for o in feas], dtype=DTYPE)[is_non_dominated(Y)]
        g = torch.Generator().manual_seed(zlib.crc32(f"pool:{self.seed}:{self.n_asked}".encode()))
        Xc, src = pol.candidate_pool(X_opt, X_front, self.d, n_sobol=self.n_sobol, n_perturb=self.n_perturb,
                                     scale=self.perturb_scale, generator=g)
        cfgs, Xr = self._round(Xc)
        ranked, vals = self._ranked(acqf, cfgs, Xr)  # usable candidates, by acquisition
        if not ranked:
            return super()._model_suggest(obs)
        Xk = Xr[ranked]
        mean, sd, p_feasible = self._pool_posterior(model, Xk, fid)
        feats = pol.candidate_features(
            log_acq=vals, mean=mean, sd=sd, best=Y.max(0).values,
            y_sd=Y.std(0) if len(Y) > 1 else torch.ones(Y.shape[-1], dtype=DTYPE),
            p_feasible=p_feasible, X=Xk, X_obs=X_obs, X_front=X_front,
            budget_used=min(self.n_asked / max(self.horizon, 1), 1.0), sources=[src[i] for i in ranked])
        if self.policy is not None:
            with torch.no_grad():
                choice = int(torch.argmax(self.policy(feats)))
        else:
            choice = 0
        if self.record_pool:
            self.last_pool = {"configs": [cfgs[i] for i in ranked], "features": feats, "chosen": choice}
        best = ranked[choice]
        self.last_info = {"n_candidates": len(ranked), "best_source": src[best],
                          "best_value": float(vals[choice]), "policy_changed": choice != 0}
        # the pool's own Sobol points are not the initial design's: "pool_sobol", ...
        source = src[best] if src[best] == "optimizer" else f"pool_{src[best]}"
        return cfgs[best], {"source": source, "decided_by": "meta_policy" if self.policy is not None
                            else "acquisition", "policy_changed": choice != 0}


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
