"""Gaussian-process surrogate and the qLogNEHVI acquisition (BoTorch), for the searcher core.

* :func:`fit_gp` -- one BoTorch ``SingleTaskGP`` per modelled metric: Matern-5/2 kernel with
  ARD lengthscales (Matern, "Gaussian Processes for Machine Learning", Rasmussen & Williams
  2006, sec. 4.2; the dimension-scaled log-normal lengthscale prior of Hvarfner et al. 2024,
  "Vanilla Bayesian Optimization Performs Great in High Dimensions"), standardised outcomes,
  marginal-likelihood fit (L-BFGS-B, bounded iterations to keep ``ask`` fast). The inputs are
  the unit-cube encoding ``n x d`` plus, when trials ran at several fidelities (ASHA), one
  fidelity column (fraction of the epoch budget), so early-stopped trials still inform the GP.
* :func:`make_acquisition` -- qLogNEHVI (Ament et al. 2023, "Unexpected Improvements to
  Expected Improvement for Bayesian Optimization", sec. 4; NEHVI: Daulton et al. 2021) on
  the modelled metrics plus *known* metrics computed from the config (the cost model), pending
  trials as ``X_pending``, learned constraints as smoothed feasibility, known constraints as a
  hard mask; evaluated at full fidelity. With one objective, qLogNEHVI is undefined (it needs
  m >= 2) and its single-objective counterpart qLogNEI (Ament et al. 2023, sec. 3; noisy EI:
  Letham et al. 2019) is used with the same objective, constraints and pending points.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import torch

DTYPE = torch.double


def fit_gp(X: torch.Tensor, Y: torch.Tensor, *, maxiter: int = 75, noise_floor: float = 1e-4,
           output_scale: bool = False, means: dict | None = None):
    """Fit one GP per column of ``Y``.

    Args:
        X: ``n x D`` inputs in the unit cube (D = d, or d + 1 with a fidelity column).
        Y: ``n x k`` outcomes (any scale; standardised inside, except the columns of ``means``).
        maxiter: L-BFGS-B iterations of the marginal-likelihood fit.
        noise_floor: lower bound of the (standardised) noise variance: BoTorch's 1e-4 by
            default; 1e-6 models a deterministic objective as Optuna's ``GPSampler`` does.
        output_scale: wrap the kernel in a learned output scale (``ScaleKernel``; Optuna's
            ``kernel_scale``) instead of a fixed one.
        means: column -> a GPyTorch mean module (a transfer prior,
            :func:`archsearch.search.transfer.prior_mean`); that column is modelled on its own
            scale (no standardisation: copula values are already standard normal).

    Returns:
        A ``ModelListGP`` with ``k`` outputs (a ``SingleTaskGP`` when ``k == 1``).
    """
    from botorch.exceptions.errors import ModelFittingError
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import ModelListGP, SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.constraints import GreaterThan
    from gpytorch.kernels import MaternKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood
    from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood
    from gpytorch.priors import LogNormalPrior

    D = X.shape[-1]
    models = []
    for j in range(Y.shape[-1]):
        prior = LogNormalPrior(loc=math.sqrt(2) + math.log(D) / 2, scale=math.sqrt(3))
        kernel = MaternKernel(nu=2.5, ard_num_dims=D, lengthscale_prior=prior)
        if output_scale:
            kernel = ScaleKernel(kernel)
        kwargs = {}
        if noise_floor != 1e-4:
            noise_prior = LogNormalPrior(loc=-4.0, scale=1.0)  # BoTorch's default prior
            kwargs["likelihood"] = GaussianLikelihood(
                noise_prior=noise_prior,
                noise_constraint=GreaterThan(noise_floor, transform=None, initial_value=noise_prior.mode))
        mean = (means or {}).get(j)
        if mean is not None:
            kwargs["mean_module"] = mean
        else:
            kwargs["outcome_transform"] = Standardize(m=1)
        models.append(SingleTaskGP(X, Y[:, j:j + 1], covar_module=kernel, **kwargs))
    model = models[0] if len(models) == 1 else ModelListGP(*models)
    mll = (ExactMarginalLogLikelihood(model.likelihood, model) if len(models) == 1
           else SumMarginalLogLikelihood(model.likelihood, model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": maxiter}},
                             max_attempts=2)
        except ModelFittingError:
            # keep the prior-initialised hyperparameters: still a valid (if vague) GP
            warnings.warn("GP marginal-likelihood fit failed; using the prior hyperparameters")
    model.eval()
    return model


class _KnownMetrics:
    """Known metrics of unit-cube rows (``... x d``), cached per row: decode + cost function."""

    def __init__(self, decode: Callable, cost_fn: Callable, names: Sequence[str], d: int):
        self.decode, self.cost_fn, self.names, self.d = decode, cost_fn, list(names), d
        self.cache: dict[bytes, list[float]] = {}

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        flat = X[..., :self.d].detach().reshape(-1, self.d).cpu().numpy()
        out = []
        for row in flat:
            key = row.tobytes()
            v = self.cache.get(key)
            if v is None:
                c = self.cost_fn(self.decode(row.tolist()))
                v = [float(c[k]) for k in self.names]
                self.cache[key] = v
            out.append(v)
        return torch.tensor(out, dtype=X.dtype).reshape(*X.shape[:-1], len(self.names))


def make_acquisition(model, *, X_baseline: torch.Tensor, ref_point: Sequence[float],
                     outputs: Sequence[tuple[str, int | str, float]],
                     learned_constraints: Sequence[tuple[int, float | None, float | None]],
                     known: _KnownMetrics | None, known_bounds: dict[str, tuple],
                     X_pending: torch.Tensor | None, d: int, fidelity: bool,
                     mc_samples: int = 64, seed: int = 0):
    """qLogNEHVI over the objectives (qLogNEI when there is one objective).

    Args:
        model: from :func:`fit_gp` (outputs = modelled metrics).
        X_baseline: ``n x d`` observed points (unit cube, without fidelity).
        ref_point: ``m`` reference point (maximisation form).
        outputs: per objective ``(kind, index, sign)``: kind ``"model"`` (index = model output)
            or ``"known"`` (index = column of ``known``); the objective is ``sign * value``.
        learned_constraints: ``(model output, min, max)`` per learned constraint.
        known: known-metric evaluator (or ``None``); ``known_bounds``: name -> (min, max) for
            the known constraints (infeasible rows get an objective below the reference point).
        X_pending: ``p x d`` pending points or ``None``.
        d: unit-cube dimension; ``fidelity``: the model has one extra input (fixed to 1 here).

    Returns:
        An acquisition function on ``b x q x d`` tensors (returns ``b``).
    """
    from botorch.acquisition import FixedFeatureAcquisitionFunction, qLogNoisyExpectedImprovement
    from botorch.acquisition.objective import GenericMCObjective
    from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
    from botorch.acquisition.multi_objective.objective import MCMultiOutputObjective
    from botorch.sampling import SobolQMCNormalSampler

    ref = torch.tensor(list(ref_point), dtype=DTYPE)
    known_idx = [(known.names.index(k), lo, hi) for k, (lo, hi) in known_bounds.items()] if known else []

    class Objective(MCMultiOutputObjective):
        def forward(self, samples, X=None):  # samples: sample x batch x n x k_model
            cols = []
            K = known(X) if known is not None else None  # batch x n x k_known
            for kind, idx, sign in outputs:
                if kind == "model":
                    cols.append(sign * samples[..., idx])
                else:
                    cols.append((sign * K[..., idx]).expand(samples.shape[:-1]))
            obj = torch.stack(cols, dim=-1)
            if known_idx:
                bad = torch.zeros(K.shape[:-1], dtype=torch.bool)
                for j, lo, hi in known_idx:
                    if lo is not None:
                        bad |= K[..., j] < lo
                    if hi is not None:
                        bad |= K[..., j] > hi
                worse = (ref - 1.0 - obj.detach().abs()).expand_as(obj)
                obj = torch.where(bad.unsqueeze(-1).expand_as(obj), worse, obj)
            return obj

    constraints = []
    for j, lo, hi in learned_constraints:
        if hi is not None:
            constraints.append(lambda Z, j=j, hi=hi: Z[..., j] - hi)
        if lo is not None:
            constraints.append(lambda Z, j=j, lo=lo: lo - Z[..., j])
    Xb = X_baseline
    Xp = X_pending
    if fidelity:
        Xb = torch.cat([Xb, torch.ones(len(Xb), 1, dtype=DTYPE)], -1)
        if Xp is not None:
            Xp = torch.cat([Xp, torch.ones(len(Xp), 1, dtype=DTYPE)], -1)
    sampler = SobolQMCNormalSampler(torch.Size([mc_samples]), seed=seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if len(outputs) == 1:
            mo = Objective()
            acqf = qLogNoisyExpectedImprovement(
                model=model, X_baseline=Xb, sampler=sampler,
                objective=GenericMCObjective(lambda samples, X=None: mo(samples, X)[..., 0]),
                constraints=constraints or None, X_pending=Xp, prune_baseline=True, cache_root=True)
        else:
            acqf = qLogNoisyExpectedHypervolumeImprovement(
                model=model, ref_point=ref, X_baseline=Xb, sampler=sampler,
                objective=Objective(), constraints=constraints or None, X_pending=Xp,
                prune_baseline=True, cache_root=True)
    if fidelity:
        acqf = FixedFeatureAcquisitionFunction(acqf, d=d + 1, columns=[d], values=[1.0])
    return acqf


def score(acqf, X: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Acquisition values of ``n x d`` candidates (one at a time, ``q = 1``). Returns ``n``."""
    out = []
    with torch.no_grad():
        for i in range(0, len(X), chunk):
            out.append(acqf(X[i:i + chunk].unsqueeze(1)))
    return torch.cat(out) if out else torch.empty(0, dtype=DTYPE)
