"""Warm starts from earlier searches: a Gaussian-copula prior fitted on past tasks.

Salinas, Shen & Perrone, "A Quantile-based Approach for Hyperparameter Transfer Learning"
(ICML 2020), sec. 3-4: each past task's objective values are mapped through that task's own
empirical CDF and the standard normal quantile, ``z = Phi^-1(F_task(y))`` (sec. 3.1: the
*Gaussian copula* transform, which makes tasks of different scales comparable); a network
``x -> (mu(x), sigma(x))`` is fitted on the pooled ``(x, z)`` of every past task by Gaussian
likelihood (sec. 3.2, their "CTS" prior); on the new task a GP models the new task's own copula
values with the prior as its mean (sec. 3.3, "CGP": a GP on the residuals of the prior). Here the
prior's weight in the GP mean is a learned hyperparameter (:class:`PriorMean`), so a prior that
does not rank the new task's observations is weighted down to a constant mean: unrelated history
falls back to a plain GP.

What history is (:func:`history_tasks`): a list of past searches, each an Optuna study (any
storage), an archsearch run directory's trials, or a list of ``{"config": {...}, "metrics":
{...}}`` rows. Parameters are matched by name and distribution with the new space; the others
are ignored (one warning line names them); an objective the history lacks gets no prior.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

DTYPE = torch.double
#: past trials used per task at most (the most recent ones): bounds the prior's fit time
MAX_ROWS_PER_TASK = 2000
#: finished trials a past task needs to count (its copula values need a few ranks)
MIN_ROWS_PER_TASK = 3


def copula(values: torch.Tensor) -> torch.Tensor:
    """Gaussian-copula transform of one task's values (``n``, maximisation form): the standard
    normal quantile of the winsorised empirical CDF, ``Phi^-1((rank + 0.5) / n)`` (Salinas et
    al. 2020, sec. 3.1), ties given their mean rank. Returns ``(n,)``."""
    n = len(values)
    if n == 0:
        return values
    order = torch.argsort(torch.argsort(values, stable=True), stable=True).to(DTYPE)
    # mean rank for ties
    uniq, inv = torch.unique(values, return_inverse=True)
    mean_rank = torch.zeros(len(uniq), dtype=DTYPE).index_add_(0, inv, order)
    mean_rank /= torch.zeros(len(uniq), dtype=DTYPE).index_add_(0, inv, torch.ones(n, dtype=DTYPE))
    u = (mean_rank[inv] + 0.5) / n
    return torch.distributions.Normal(0.0, 1.0).icdf(u.to(DTYPE))


def _param_matches(a, b) -> bool:
    """Whether two archsearch params have the same distribution (type, range, log, choices)."""
    if a.type != b.type:
        return False
    if a.type == "categorical":
        return list(a.choices) == list(b.choices)
    return (a.low, a.high, bool(getattr(a, "log", False))) == (b.low, b.high, bool(getattr(b, "log", False)))


@dataclass
class HistoryTask:
    """One past search: its trials' configs and metrics (finished trials only)."""

    name: str
    configs: list[dict[str, Any]]
    metrics: list[dict[str, float]]


def _from_optuna(study, metric_names: Sequence[str]) -> HistoryTask:
    """The complete trials of an Optuna study. Its objectives are named by
    ``study.metric_names`` when set, else taken in the order of ``metric_names``."""
    import optuna

    names = list(study.metric_names or metric_names[:len(study.directions)])
    configs, metrics = [], []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.values is None:
            continue
        configs.append(dict(t.params))
        metrics.append({k: float(v) for k, v in zip(names, t.values)})
    return HistoryTask(study.study_name, configs, metrics)


def history_tasks(history: Iterable[Any], metric_names: Sequence[str]) -> list[HistoryTask]:
    """Normalise ``history`` (Optuna studies, :class:`HistoryTask` or lists of ``{"config",
    "metrics"}`` rows) into :class:`HistoryTask` objects.

    Raises:
        TypeError: an entry of another kind.
    """
    out = []
    for i, h in enumerate(history or []):
        if isinstance(h, HistoryTask):
            out.append(h)
        elif hasattr(h, "get_trials") and hasattr(h, "directions"):
            out.append(_from_optuna(h, metric_names))
        elif isinstance(h, (list, tuple)):
            rows = [r for r in h if r.get("metrics")]
            out.append(HistoryTask(f"history[{i}]", [dict(r["config"]) for r in rows],
                                   [dict(r["metrics"]) for r in rows]))
        else:
            raise TypeError(f"history[{i}]: expected an Optuna study or a list of "
                            f"{{'config', 'metrics'}} rows, got {type(h).__name__}")
    return out


def _hv_max(Y: torch.Tensor, ref: torch.Tensor) -> float:
    """Hypervolume of ``Y`` (``k x m``, maximised) above ``ref`` (:func:`archsearch.pareto.hypervolume`)."""
    from archsearch.pareto import hypervolume

    return hypervolume(Y.numpy(), ["max"] * Y.shape[-1], ref.tolist()) if len(Y) else 0.0


class CopulaPrior(torch.nn.Module):
    """The transfer prior: ``x -> (mu, sigma)`` of each objective's copula value.

    A two-hidden-layer MLP (50 tanh units each, as Salinas et al. 2020, sec. 4) on the unit-cube
    columns of the parameters the history shares with the space, fitted by Gaussian
    likelihood on every past task's copula values (:func:`copula`), full-batch Adam.

    Args:
        space: the new search space.
        history: past searches (:func:`history_tasks`).
        metrics, signs: the objectives to model and their signs (``+1`` maximise).
        seed: initialisation and fit seed.
        steps: Adam steps.

    Attributes:
        columns: ``(d_shared,)`` unit-cube columns the prior reads; ``ignored``: history
        parameters not in the space with the same distribution; ``objectives``: the indices
        of ``metrics`` the history holds (the others get no prior); ``n_tasks``, ``n_rows``.

    Raises:
        ValueError: no task with at least :data:`MIN_ROWS_PER_TASK` usable trials, no shared
            parameter, or none of the objectives.
    """

    def __init__(self, space, history, metrics: Sequence[str], signs: Sequence[float], *,
                 seed: int = 0, steps: int = 400, hidden: int = 50):
        super().__init__()
        tasks = history_tasks(history, metrics)
        hist_params: dict[str, set] = {}
        for t in tasks:
            for c in t.configs:
                for k in c:
                    hist_params.setdefault(k, set())
        shared = [k for k in space.params if k in hist_params]
        self.ignored = sorted(k for k in hist_params if k not in space.params)
        # a param whose values fall outside the space's range has another distribution
        for k in list(shared):
            p = space.params[k]
            vals = [c[k] for t in tasks for c in t.configs if k in c]
            if p.type == "categorical":
                bad = any(v not in p.choices for v in vals)
            else:
                bad = any(not isinstance(v, (int, float)) or v < p.low or v > p.high for v in vals)
            if bad:
                shared.remove(k)
                self.ignored.append(k)
        if not shared:
            raise ValueError("the history shares no parameter with the search space")
        dims = space.dims()
        self.columns = [j for j, (k, _) in enumerate(dims) if k in shared]
        self.shared = shared
        self.objectives = [j for j, m in enumerate(metrics)
                           if any(m in r for t in tasks for r in t.metrics)]
        if not self.objectives:
            raise ValueError(f"the history holds none of the objectives {', '.join(metrics)}")
        Xs, Zs, Ms, Ts = [], [], [], []
        used = 0
        for t in tasks:
            rows = [(c, m) for c, m in zip(t.configs, t.metrics)
                    if all(k in c for k in shared)][-MAX_ROWS_PER_TASK:]
            if len(rows) < MIN_ROWS_PER_TASK:
                continue
            used += 1
            enc = torch.tensor([space.encode({**space.decode([0.5] * len(dims)), **{k: c[k] for k in shared}})
                                for c, _ in rows], dtype=DTYPE)[:, self.columns]
            Z = torch.zeros(len(rows), len(self.objectives), dtype=DTYPE)
            M = torch.zeros_like(Z, dtype=torch.bool)
            for jj, j in enumerate(self.objectives):
                vals = [signs[j] * m[metrics[j]] if metrics[j] in m and math.isfinite(m[metrics[j]]) else None
                        for _, m in rows]
                idx = [i for i, v in enumerate(vals) if v is not None]
                if len(idx) >= MIN_ROWS_PER_TASK:
                    Z[idx, jj] = copula(torch.tensor([vals[i] for i in idx], dtype=DTYPE))
                    M[idx, jj] = True
            Xs.append(enc)
            Zs.append(Z)
            Ms.append(M)
            Ts.append(torch.full((len(rows),), used - 1, dtype=torch.long))
        if not used:
            raise ValueError(f"no history task has {MIN_ROWS_PER_TASK} or more finished trials in this space")
        self.n_tasks, self.n_rows = used, sum(len(x) for x in Xs)
        X, Z, M, T = torch.cat(Xs), torch.cat(Zs), torch.cat(Ms), torch.cat(Ts)
        m = len(self.objectives)
        g = torch.Generator().manual_seed(int(seed))
        self.trunk = torch.nn.Sequential(torch.nn.Linear(len(self.columns), hidden), torch.nn.Tanh(),
                                         torch.nn.Linear(hidden, hidden), torch.nn.Tanh()).to(DTYPE)
        self.head = torch.nn.Linear(hidden, 2 * m).to(DTYPE)
        # one linear head per past task on the shared features (as ABLR, Perrone et al. 2018):
        # each task's own copula values, for the set-cover design (:meth:`design`)
        self.task_head = torch.nn.Linear(hidden, used * m).to(DTYPE)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=DTYPE) * (1.0 / math.sqrt(max(p.shape[-1], 1))))
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        rows_idx = torch.arange(len(X))
        for _ in range(int(steps)):
            opt.zero_grad()
            h = self.trunk(X)
            mu, log_sd = self._split(self.head(h))
            nll = (log_sd + 0.5 * ((Z - mu) / log_sd.exp()) ** 2)[M].mean()
            own = self.task_head(h).reshape(len(X), used, m)[rows_idx, T]  # (n, m): each row's task
            mse = ((own - Z) ** 2)[M].mean()
            (nll + mse).backward()
            opt.step()
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    @staticmethod
    def _split(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = out.shape[-1] // 2
        return out[..., :m], out[..., m:].clamp(-5, 3)

    def forward(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior mean and standard deviation of the copula values of ``X`` (``... x D`` unit
        cube, ``D >= d``: extra columns such as a fidelity are ignored). Returns two ``... x m``
        tensors (``m = len(objectives)``)."""
        mu, log_sd = self._split(self.head(self.trunk(X[..., self.columns])))
        return mu, log_sd.exp()

    def per_task(self, X: torch.Tensor) -> torch.Tensor:
        """Each past task's predicted copula values at ``X`` (``n x D``): ``(n_tasks, n, m)``."""
        out = self.task_head(self.trunk(X[..., self.columns]))
        return out.reshape(len(X), self.n_tasks, -1).transpose(0, 1)

    def design(self, space, n: int, *, seed: int = 0, pool: int = 2048, feasible=None,
               method: str = "mean") -> list[dict[str, Any]]:
        """An initial design of ``n`` configs from the prior, chosen in a scrambled Sobol pool
        of ``pool`` configs (``feasible(config) -> bool`` drops known-infeasible ones).

        ``method="setcover"``: greedily, the config that most raises the mean over the past
        tasks of the normalised hypervolume of the chosen set, each task's values predicted by
        its own head (:meth:`per_task`; with one objective the hypervolume is the best value
        above the pool's worst): configs good across the history, as Wistuba et al. 2015
        ("Learning hyperparameter optimization initializations") choose them from a shared
        table, here from a model so that past tasks need not share configs.
        ``method="mean"``: with one modelled objective, Thompson draws from the prior (``mu +
        sigma * eps``, argmax, Salinas et al. 2020, sec. 3.2); with several, greedy
        hypervolume of the prior means (maximisation form; reference: the pool's worst).

        Raises:
            ValueError: unknown ``method``.
        """
        if method not in ("setcover", "mean"):
            raise ValueError(f"unknown design method {method!r}: setcover or mean")
        from botorch.utils.multi_objective.hypervolume import Hypervolume

        d = len(space.dims())
        U = torch.quasirandom.SobolEngine(d, scramble=True, seed=int(seed)).draw(pool).to(DTYPE)
        cfgs = [space.decode(u) for u in U.tolist()]
        keep = [i for i, c in enumerate(cfgs) if feasible is None or feasible(c)] or list(range(len(cfgs)))
        cfgs = [cfgs[i] for i in keep]
        X = torch.tensor([space.encode(c) for c in cfgs], dtype=DTYPE)
        with torch.no_grad():
            mu, sd = self(X)
        chosen: list[int] = []
        g = torch.Generator().manual_seed(int(seed) + 1)
        if method == "setcover":
            return [dict(cfgs[i]) for i in self._setcover(X, n)]
        if mu.shape[-1] == 1:
            for _ in range(min(n, len(cfgs))):
                draw = mu[:, 0] + sd[:, 0] * torch.randn(len(cfgs), generator=g, dtype=DTYPE)
                if chosen:
                    draw[chosen] = -math.inf
                chosen.append(int(draw.argmax()))
        else:
            from botorch.utils.multi_objective.pareto import is_non_dominated

            ref = mu.min(0).values - 1e-6
            hv = Hypervolume(ref)
            for _ in range(min(n, len(cfgs))):
                # the largest gain is always on the non-dominated set of what is left
                left = [i for i in range(len(cfgs)) if i not in chosen]
                cand = [i for i, nd in zip(left, is_non_dominated(mu[left]).tolist()) if nd]
                base = mu[chosen]
                gains = [hv.compute(torch.cat([base, mu[i:i + 1]])) for i in cand]
                chosen.append(cand[max(range(len(cand)), key=gains.__getitem__)])
        return [dict(cfgs[i]) for i in chosen]

    def _setcover(self, X: torch.Tensor, n: int) -> list[int]:
        """Greedy set cover of the past tasks' predicted fronts (see :meth:`CopulaPrior.design`)."""
        from botorch.utils.multi_objective.pareto import is_non_dominated

        with torch.no_grad():
            P = self.per_task(X)  # (tasks, pool, m)
        refs = P.min(1).values - 1e-6  # (tasks, m)
        # candidates: the union of each task's predicted front (the greedy gain is largest there)
        cand = sorted({int(i) for t in range(len(P)) for i in torch.nonzero(is_non_dominated(P[t])).flatten()})
        full = [_hv_max(P[t][cand], refs[t]) or 1.0 for t in range(len(P))]
        chosen: list[int] = []
        for _ in range(min(n, len(X))):
            left = [i for i in cand if i not in chosen] or [i for i in range(len(X)) if i not in chosen]
            gains = [sum(_hv_max(P[t][chosen + [i]], refs[t]) / full[t] for t in range(len(P))) for i in left]
            chosen.append(left[max(range(len(left)), key=gains.__getitem__)])
        return chosen


def prior_mean(prior: CopulaPrior, column: int):
    """A GPyTorch mean ``a * mu_column(x) + b`` around one objective's :class:`CopulaPrior`
    mean, ``a`` and ``b`` learned by marginal likelihood (``a`` starts at 1): the GP models the
    new task's residuals from the prior (Salinas et al. 2020, sec. 3.3); ``a`` goes to 0 when
    the prior does not rank the new task's observations, leaving a constant mean as without
    history. The prior itself is fixed (not a submodule: the fit does not touch it)."""
    from gpytorch.means import Mean

    class _PriorMean(Mean):
        def __init__(self):
            super().__init__()
            self.column = column
            self.register_parameter("weight", torch.nn.Parameter(torch.ones(1, dtype=DTYPE)))
            self.register_parameter("constant", torch.nn.Parameter(torch.zeros(1, dtype=DTYPE)))

        def forward(self, x):
            return self.weight * prior(x)[0][..., column] + self.constant

    return _PriorMean()


def rank_agreement(prior: CopulaPrior, X: torch.Tensor, Z: torch.Tensor) -> list[float]:
    """Spearman correlation per modelled objective between the prior mean and the new task's
    copula values ``Z`` (``n x m``) at ``X`` (``n x D``): how well the prior has ranked this
    task's observations so far."""
    with torch.no_grad():
        mu, _ = prior(X)
    out = []
    for j in range(Z.shape[-1]):
        a, b = copula(mu[:, j]), Z[:, j]
        out.append(float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if len(a) > 2 else 0.0)
    return out


def warn_ignored(prior: CopulaPrior) -> None:
    """One warning line naming the history parameters the prior ignores."""
    if prior.ignored:
        warnings.warn(f"history parameters not in the search space (or with another range) "
                      f"ignored: {', '.join(prior.ignored)}", stacklevel=3)
