"""Search spaces: a YAML file validated into a :class:`SearchSpace`.

A search space names the task and dataset, the objectives (metric + ``min``/``max``), optional
constraints, the budget, and the searchable params::

    name: default
    task: classification
    dataset: {name: rotten_tomatoes_sentences, max_len: 48, vocab_size: 8000}
    objectives:
      - {metric: accuracy, mode: max}
      - {metric: flops_per_sample, mode: min}
    constraints:
      params_trainable: {max: 2000000}
    budget: {trials: 12, max_concurrent: 2, epochs: 4}
    params:
      n_layers: {type: int, low: 1, high: 4}
      lr: {type: float, low: 3.0e-4, high: 3.0e-3, log: true}
      d_model: {type: categorical, choices: [64, 128]}
      flops_budget: {type: float, low: 0.25, high: 1.0, when: {gating: dht}}
    fixed: {dropout: 0.1}

Every mistake raises :class:`archsearch.errors.UserError` naming the file and the dotted field
(``default.yaml: params.n_layers.low: ...``). Unknown keys are errors, never ignored.

The space converts to a Ray Tune param space (:meth:`SearchSpace.to_ray`), to Optuna
distributions (:meth:`SearchSpace.to_optuna` / :meth:`SearchSpace.suggest`, define-by-run with
conditions), and to and from the unit cube (:meth:`SearchSpace.encode` / :meth:`decode`),
which the model-based searchers use.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from archsearch.errors import UserError

#: Metric names (docs/design.md), with the direction that makes each one "better": a live
#: view of :data:`archsearch.metrics.METRICS`, the one table of metrics.
from archsearch.metrics import DIRECTIONS as METRICS
from archsearch.metrics import is_number

#: Model and optimiser keys the trainable reads itself. ``gating`` / ``tying`` name a registered
#: strategy (:mod:`archsearch.dynamic`), and every other key of ``params``/``fixed`` must be a
#: field of the ``Settings`` of a strategy the space can pick (validated there, see
#: :meth:`SearchSpace._check_params`); anything else is an error.
MODEL_KEYS = {
    "n_layers", "d_model", "n_heads", "d_ffn", "d_ffn_mult", "dropout", "lr", "weight_decay",
    "batch_size", "warmup_steps", "label_smoothing", "init_from", "gating", "tying",
}

Scalar = Union[int, float, str, bool]

_Unit = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]


class _ModelValues(BaseModel):
    """The range of each :data:`MODEL_KEYS` value (one key checked at a time): what the
    trainable would otherwise refuse only when a trial builds its model, or take silently
    (``n_layers: 1.5`` cut to 1, ``batch_size: 0`` replaced by the budget's)."""

    model_config = ConfigDict(extra="ignore", strict=False)

    n_layers: Annotated[int, Field(ge=1)] | None = None
    d_model: Annotated[int, Field(ge=1)] | None = None
    n_heads: Annotated[int, Field(ge=1)] | None = None
    d_ffn: Annotated[int, Field(ge=1)] | None = None
    d_ffn_mult: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    dropout: _Unit | None = None
    lr: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    weight_decay: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    batch_size: Annotated[int, Field(ge=1)] | None = None
    warmup_steps: Annotated[int, Field(ge=0)] | None = None
    label_smoothing: _Unit | None = None
    init_from: str | None = None

    @field_validator("n_layers", "d_model", "n_heads", "d_ffn", "batch_size", "warmup_steps", mode="before")
    @classmethod
    def _whole(cls, v):
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError(f"must be a whole number, got {v!r}")
        return v


class _Strict(BaseModel):
    # no NaN or infinity anywhere in a space: a reference, a bound, a step, a fixed value
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IntParam(_Strict):
    """An integer in ``[low, high]`` (both inclusive), optionally on a log scale."""

    type: Literal["int"]
    low: int
    high: int
    step: int = 1
    log: bool = False
    when: dict[str, Union[Scalar, list[Scalar]]] | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        if self.step < 1:
            raise ValueError("step must be >= 1")
        if self.log and self.low <= 0:
            raise ValueError("log scale needs low > 0")
        if self.log and self.step != 1:  # Optuna's IntDistribution refuses it at search time
            raise ValueError(f"step ({self.step}) and log scale cannot be combined")
        return self


class FloatParam(_Strict):
    """A float in ``[low, high]``, optionally on a log scale or on a grid of ``step``
    (``low + k * step``, as Optuna's ``FloatDistribution(step=...)``; not with ``log``)."""

    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = None
    when: dict[str, Union[Scalar, list[Scalar]]] | None = None

    @model_validator(mode="after")
    def _check(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite")
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("log scale needs low > 0")
        if self.step is not None and (self.step <= 0 or self.log):
            raise ValueError("step must be > 0 and cannot be combined with log")
        return self


class CategoricalParam(_Strict):
    """One of ``choices`` (numbers, strings or booleans)."""

    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)
    when: dict[str, Union[Scalar, list[Scalar]]] | None = None

    @field_validator("choices")
    @classmethod
    def _unique(cls, v):
        if len(set(map(repr, v))) != len(v):
            raise ValueError("choices must be unique")
        return v


#: Tagged by ``type``: a mistake is reported for the param's own kind, at its own field
#: (``params.lr.low``), not for each kind the value could have been.
Param = Annotated[Union[IntParam, FloatParam, CategoricalParam], Field(discriminator="type")]


class ObjectiveSpec(_Strict):
    """An objective of any name (what the searcher cores need); :class:`Objective` is the
    platform's, whose metric must be one of :data:`METRICS`."""

    metric: str
    mode: Literal["min", "max"]
    ref: float | None = None  #: reference value for the hypervolume (default: from the data)


class Objective(ObjectiveSpec):
    @field_validator("metric")
    @classmethod
    def _known(cls, v):
        if v not in METRICS:
            raise ValueError(f"unknown metric {v!r}; known: {', '.join(METRICS)}")
        return v


class Bound(_Strict):
    min: Annotated[float, Field(allow_inf_nan=False)] | None = None
    max: Annotated[float, Field(allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


class DatasetSpec(_Strict):
    name: str = "rotten_tomatoes_sentences"
    text_column: str | None = None
    label_column: str | None = None
    tokenizer: str | None = None  #: "bpe", "wordpiece", "char", a checkpoint dir or a Hub model id (default: char for lm, bpe otherwise)
    vocab_size: int = Field(8000, ge=64, le=1_000_000)
    max_len: int = Field(48, ge=4, le=8192)
    max_train_samples: int | None = Field(None, ge=1)


class Budget(_Strict):
    trials: int = Field(12, ge=1)
    max_concurrent: int = Field(2, ge=1)
    epochs: int = Field(4, ge=1)
    steps_per_epoch: int | None = Field(None, ge=1)  #: LM: batches per epoch (default: one pass)
    batch_size: int = Field(64, ge=1)
    #: early stopping: ``asha`` (Ray's ASHAScheduler), ``ahto`` (the learned policy at ASHA's
    #: rungs: :class:`archsearch.tune.scheduler.AHTOScheduler`), ``median`` (Ray's
    #: MedianStoppingRule) or ``none``
    scheduler: Literal["none", "asha", "ahto", "median"] = "asha"
    grace_period: int = Field(1, ge=1)  #: ASHA/AHTO/median: epochs before a trial may be stopped
    reduction_factor: int = Field(3, ge=2)
    cpus_per_trial: float = Field(1.0, gt=0, allow_inf_nan=False)
    gpus_per_trial: float = Field(0.0, ge=0, allow_inf_nan=False)
    #: Ray ``memory`` resource of one trial, in GiB (default: none asked for)
    memory_per_trial_gb: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: a trial waiting this long for resources no node of the cluster has fails the search
    #: (:class:`archsearch.tune.pending.PendingWatch`)
    pending_timeout_s: float = Field(600.0, gt=0, allow_inf_nan=False)
    time_budget_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    latency_batch_size: int = Field(32, ge=1)
    max_failures: int = Field(1, ge=0)  #: retries of a failed trial from its last checkpoint
    #: training/inference precision (:func:`archsearch.tune.trainable.resolve_precision`): fp32
    #: by default (measured faster than bf16 for small batches on an H100); ``auto`` = bf16 where
    #: the GPU supports it, fp32 on a CPU
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    #: what a finished search keeps of its trials' checkpoints (:mod:`archsearch.tune.weights`):
    #: ``pareto`` the front's and each objective's best trial, weights only; ``all`` every
    #: finished trial, weights only; ``none`` nothing (no trial can be exported)
    keep_weights: Literal["pareto", "all", "none"] = "pareto"


class _UnitCube:
    """What a searcher core needs of a space (mixed into :class:`ParamSpace` and
    :class:`SearchSpace`): conditions, Optuna and Ray Tune distributions, the unit-cube
    encoding, constraint values. Uses ``self.params``, ``self.objectives`` and
    ``self.constraints``."""

    # ------------------------------------------------------------------ conditions
    def active(self, key: str, config: dict[str, Any]) -> bool:
        """Whether param ``key`` applies given the values already chosen in ``config``."""
        for dep, val in (self.params[key].when or {}).items():
            allowed = val if isinstance(val, list) else [val]
            if dep not in config or config[dep] not in allowed:
                return False
        return True

    # ------------------------------------------------------------------ Optuna
    def to_optuna(self) -> dict[str, Any]:
        """All params as ``optuna.distributions`` (conditions ignored: see :meth:`suggest`)."""
        import optuna.distributions as d

        out: dict[str, Any] = {}
        for key, p in self.params.items():
            if isinstance(p, IntParam):
                out[key] = d.IntDistribution(p.low, p.high, log=p.log, step=p.step)
            elif isinstance(p, FloatParam):
                out[key] = d.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
            else:
                out[key] = d.CategoricalDistribution(p.choices)
        return out

    def suggest(self, trial) -> dict[str, Any]:
        """Define-by-run sampling for an ``optuna.Trial``: only active params are suggested.

        Returns the config (params only; :attr:`fixed` is added by the trainable).
        """
        config: dict[str, Any] = {}
        for key, p in self.params.items():
            if not self.active(key, config):
                continue
            if isinstance(p, IntParam):
                config[key] = trial.suggest_int(key, p.low, p.high, step=p.step, log=p.log)
            elif isinstance(p, FloatParam):
                config[key] = trial.suggest_float(key, p.low, p.high, log=p.log, step=p.step)
            else:
                config[key] = trial.suggest_categorical(key, p.choices)
        return config

    # ------------------------------------------------------------------ Ray Tune
    def to_ray(self) -> dict[str, Any]:
        """A Ray Tune ``param_space``; a conditional param is ``None`` when inactive."""
        from ray import tune

        out: dict[str, Any] = {}
        for key, p in self.params.items():
            if isinstance(p, IntParam):
                dom = (tune.lograndint(p.low, p.high + 1) if p.log
                       else tune.qrandint(p.low, p.high, p.step) if p.step > 1
                       else tune.randint(p.low, p.high + 1))
            elif isinstance(p, FloatParam):
                dom = (tune.loguniform(p.low, p.high) if p.log
                       else tune.quniform(p.low, p.high, p.step) if p.step
                       else tune.uniform(p.low, p.high))
            else:
                dom = tune.choice(p.choices)
            if p.when:
                dom = tune.sample_from(_Conditional(self, key, dom))
            out[key] = dom
        return out

    # ------------------------------------------------------------------ unit cube
    def dims(self) -> list[tuple[str, Any]]:
        """The unit-cube dimensions, in order: ``(param, None)`` for a numeric param and
        ``(param, choice)`` for each one-hot column of a categorical one."""
        out: list[tuple[str, Any]] = []
        for key, p in self.params.items():
            if isinstance(p, CategoricalParam):
                out += [(key, c) for c in p.choices]
            else:
                out.append((key, None))
        return out

    def encode(self, config: dict[str, Any]) -> list[float]:
        """Map a config to the unit cube: ints and floats scaled to [0, 1] (log scale when
        ``log``), categoricals one-hot. Inactive params encode as 0 (numeric: their low)."""
        x: list[float] = []
        for key, p in self.params.items():
            v = config.get(key)
            if isinstance(p, CategoricalParam):
                x += [1.0 if v == c else 0.0 for c in p.choices]
            elif v is None:
                x.append(0.0)
            elif p.low == p.high:
                x.append(0.0)
            elif p.log:
                x.append((math.log(v) - math.log(p.low)) / (math.log(p.high) - math.log(p.low)))
            else:
                x.append((v - p.low) / (p.high - p.low))
        return x

    def decode(self, x: list[float]) -> dict[str, Any]:
        """Inverse of :meth:`encode`: rounds ints, takes the arg-max one-hot column, clips to
        bounds and drops inactive params."""
        config: dict[str, Any] = {}
        i = 0
        for key, p in self.params.items():
            if isinstance(p, CategoricalParam):
                cols = x[i:i + len(p.choices)]
                value: Any = p.choices[max(range(len(cols)), key=cols.__getitem__)]
                i += len(p.choices)
            else:
                u = min(max(float(x[i]), 0.0), 1.0)
                i += 1
                if p.log:
                    value = math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
                else:
                    value = p.low + u * (p.high - p.low)
                if isinstance(p, IntParam):
                    value = p.low + round((value - p.low) / p.step) * p.step
                    value = int(min(max(value, p.low), p.high))
                elif p.step:  # the grid low + k * step, k <= (high - low) / step
                    k = min(round((value - p.low) / p.step), math.floor((p.high - p.low) / p.step + 1e-9))
                    value = float(min(p.low + k * p.step, p.high))
                else:  # exp/log round-trips can overshoot a bound by an ulp
                    value = min(max(value, p.low), p.high)
            if self.active(key, config):
                config[key] = value
        return config

    @property
    def metric_names(self) -> list[str]:
        return [o.metric for o in self.objectives]

    @property
    def modes(self) -> list[str]:
        return [o.mode for o in self.objectives]

    def constraint_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Optuna-style constraint values of ``self.constraints`` (feasible when <= 0), one per
        bound: ``METRIC.max`` is ``value - max``, ``METRIC.min`` is ``min - value`` (0 when
        the metric is unknown; NaN/inf: infeasible, not an error)."""
        out = {}
        for k, b in (self.constraints or {}).items():
            v = metrics.get(k)
            if v is not None and not math.isfinite(float(v)):
                v = math.inf if b.max is not None else -math.inf
            if b.max is not None:
                out[f"{k}.max"] = 0.0 if v is None else float(v) - b.max
            if b.min is not None:
                out[f"{k}.min"] = 0.0 if v is None else b.min - float(v)
        return out


class ParamSpace(_UnitCube, _Strict):
    """A search space over any named params and metrics: what the searcher cores work on when
    they are used outside archsearch (e.g. :class:`archsearch.search.samplers.AHTOSampler`
    builds one from an Optuna study's distributions). :class:`SearchSpace` is the platform's
    own, whose params and metrics must be model keys and :data:`METRICS`."""

    name: str = "space"
    objectives: list[ObjectiveSpec] = Field(min_length=1)
    constraints: dict[str, Bound] = {}
    params: dict[str, Param] = Field(min_length=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)  #: the searchers' (NumPy's) seed range

    @field_validator("objectives")
    @classmethod
    def _distinct(cls, v):
        if len({o.metric for o in v}) != len(v):
            raise ValueError("an objective is listed twice")
        return v


class SearchSpace(_UnitCube, _Strict):
    """A validated search space. Build it with :func:`load_space`."""

    name: str
    task: Literal["classification", "lm"] = "classification"
    dataset: DatasetSpec = DatasetSpec()
    objectives: list[Objective] = Field(min_length=1)
    constraints: dict[str, Bound] = {}
    budget: Budget = Budget()
    params: dict[str, Param] = Field(min_length=1)
    fixed: dict[str, Scalar] = {}
    seed: int = Field(0, ge=0, le=2**32 - 1)  #: the searchers' (NumPy's) seed range
    source: str | None = Field(None, exclude=True)  #: the YAML file it came from

    @field_validator("constraints")
    @classmethod
    def _known_constraints(cls, v):
        from archsearch.metrics import METRICS as ROWS

        for k, b in v.items():
            if k not in METRICS:
                raise ValueError(f"unknown metric {k!r}; known: {', '.join(METRICS)}")
            low, high = ROWS[k].low, ROWS[k].high  # what the metric can take at all
            if b.min is not None and high is not None and b.min > high:
                raise ValueError(f"{k}: no trial can meet min {b.min:g}: {k} is at most {high:g}")
            if b.max is not None and low is not None and b.max < low:
                raise ValueError(f"{k}: no trial can meet max {b.max:g}: {k} is at least {low:g}")
        return v

    @model_validator(mode="after")
    def _check_params(self):
        names = set(self.params)
        self._check_strategy_keys()
        self._check_model_values()
        both = names & set(self.fixed)
        if both:
            raise _FieldError(f"fixed.{sorted(both)[0]}", "is both searched (params) and fixed")
        for key, p in self.params.items():
            for dep, val in (p.when or {}).items():
                if dep not in names:
                    raise _FieldError(f"params.{key}.when.{dep}", f"{dep!r} is not a param")
                if dep == key:
                    raise _FieldError(f"params.{key}.when", "a param cannot depend on itself")
                dp = self.params[dep]
                if not isinstance(dp, CategoricalParam):
                    raise _FieldError(f"params.{key}.when.{dep}", "conditions must name a categorical param")
                if isinstance(val, list) and not val:
                    raise _FieldError(f"params.{key}.when.{dep}", "an empty list: the param would never be active")
                for v in val if isinstance(val, list) else [val]:
                    if v not in dp.choices:
                        raise _FieldError(f"params.{key}.when.{dep}", f"{v!r} is not one of {dp.choices}")
        # conditions are only allowed on params declared before (so define-by-run order works)
        order = list(self.params)
        for key, p in self.params.items():
            for dep in p.when or {}:
                if order.index(dep) > order.index(key):
                    raise _FieldError(f"params.{key}.when.{dep}", f"declare {dep!r} before {key!r}")
        modes = {o.metric for o in self.objectives}
        if len(modes) != len(self.objectives):
            raise _FieldError("objectives", "an objective is listed twice")
        self._check_task_metrics()
        return self

    def _check_task_metrics(self) -> None:
        """Every objective and constraint names a metric this space's task reports (a
        classification trial reports no perplexity: every trial would fail after training)."""
        from archsearch.metrics import METRICS as ROWS

        named = [(f"objectives.{i}.metric", o.metric) for i, o in enumerate(self.objectives)]
        named += [(f"constraints.{k}", k) for k in self.constraints]
        for field, metric in named:
            task = ROWS[metric].task
            if task is not None and task != self.task:
                raise _FieldError(field, f"{metric!r} is reported by task {task!r} only; this space's "
                                         f"task is {self.task!r}")

    def _values(self, key: str) -> list[tuple[str, Any]]:
        """``(field, value)`` of every value the space can give ``key``: the fixed value, a
        categorical's choices, or an int/float param's ``low`` and ``high``."""
        if key in self.fixed:
            return [(f"fixed.{key}", self.fixed[key])]
        p = self.params.get(key)
        if p is None:
            return []
        if isinstance(p, CategoricalParam):
            return [(f"params.{key}.choices", v) for v in p.choices]
        return [(f"params.{key}.low", p.low), (f"params.{key}.high", p.high)]

    def _check_model_values(self) -> None:
        """Every value the space can give a model or optimiser key is in its range
        (:class:`_ModelValues`), and without ``init_from`` every ``d_model`` it can pick divides
        by every ``n_heads`` (ranges of at most 4,096 integers are enumerated; conditions are
        not taken into account)."""
        for key in MODEL_KEYS - {"gating", "tying"}:
            for field, v in self._values(key):
                try:
                    _ModelValues.model_validate({key: v})
                except ValidationError as e:
                    raise _FieldError(field, f"{v!r}: {e.errors()[0]['msg']}") from None
        if self._values("init_from"):
            return
        d_models, heads = self._all_ints("d_model"), self._all_ints("n_heads")
        for d in d_models or [64]:  # archsearch.models.config.DEFAULTS
            for h in heads or [4]:
                if d % h:
                    where = "params.d_model" if "d_model" in self.params else "fixed.d_model"
                    raise _FieldError(where, f"d_model {d} is not divisible by n_heads {h} (the "
                                             "space can pick both): every d_model must be a "
                                             "multiple of every n_heads")

    def _all_ints(self, key: str) -> list[int] | None:
        """Every integer value the space can give ``key`` (``None``: none, or a range of more
        than 4,096)."""
        p = self.params.get(key)
        if key not in self.fixed and isinstance(p, IntParam):
            if (p.high - p.low) // p.step >= 4096:
                return None
            return list(range(p.low, p.high + 1, p.step))
        vals = [v for _, v in self._values(key)]
        return [int(v) for v in vals] or None

    def _check_strategy_keys(self) -> None:
        """``gating``/``tying`` values name registered strategies, and every other non-model key
        is a ``Settings`` field of a strategy the space can pick, with a value each such
        strategy's ``Settings`` accepts (:mod:`archsearch.dynamic`: the registry)."""
        from archsearch.dynamic import GATING, TYING, settings_owners, strategy_class

        picks: dict[str, set[str]] = {}
        for kind, table, default in (("gating", GATING, "static"), ("tying", TYING, "none")):
            vals = self._values(kind) or [(kind, default)]
            for field, v in vals:
                if v not in table:
                    raise _FieldError(field, f"unknown {kind} {v!r}; known: {', '.join(table)}")
            picks[kind] = {v for _, v in vals}
        owners = settings_owners()
        for key in list(self.params) + list(self.fixed):
            where = f"params.{key}" if key in self.params else f"fixed.{key}"
            if key in MODEL_KEYS:
                continue
            if key not in owners:
                known = sorted(MODEL_KEYS | set(owners))
                raise _FieldError(where, f"unknown parameter {key!r}; known: {', '.join(known)}")
            mine = [(k, n) for k, n in owners[key] if n in picks[k]]
            if not mine:
                names = ", ".join(f"{k}: {n}" for k, n in owners[key])
                can = ", ".join(f"{k}: {n}" for k in picks for n in sorted(picks[k]))
                raise _FieldError(where, f"{key!r} is a setting of {names}, which this space never "
                                         f"picks (it picks {can})")
            for field, v in self._values(key):
                for kind, name in mine:
                    try:
                        strategy_class(kind, name).Settings.from_config({key: v}, task=self.task)
                    except ValueError as e:
                        raise _FieldError(field, f"{kind} {name}: {str(e).removeprefix(key + ': ')}") from None
        # settings that must go together (depth_supervision needs depth_all_exits...): exactly
        # what every trial of a strategy gets when the space fixes all its settings it gives
        for kind in picks:
            for name in sorted(picks[kind]):
                keys = [k for k, who in owners.items() if (kind, name) in who]
                given = {k: self.fixed[k] for k in keys if k in self.fixed}
                if len(given) < 2 or any(k in self.params for k in keys):
                    continue
                try:
                    strategy_class(kind, name).Settings.from_config(given, task=self.task)
                except ValueError as e:
                    key = str(e).split(":", 1)[0]
                    raise _FieldError(f"fixed.{key}" if key in given else "fixed", f"{kind} {name}: {e}") from None

    def pinned(self, config: dict[str, Any]) -> "SearchSpace":
        """This space with each param in ``config`` pinned to its value (a one-choice
        categorical), so any searcher proposes exactly ``config``: re-running one trial.

        What the pinned values make inactive is dropped, so the result is a space file of its
        own (written as the run's ``space.yaml``, read back by ``report`` and ``resume``): a
        param whose ``when:`` no longer holds (``dht_lambda`` when ``gating`` is pinned to
        ``static``), ``when:`` values no longer among the choices, and params and ``fixed``
        settings of strategies the space no longer picks.

        Raises:
            UserError: a key that is not a param of the space, a value outside its range, a
                fraction for an int param, or a value the space's own checks refuse (a
                ``d_model`` its heads do not divide...), naming ``--fixed``.
        """
        params = dict(self.params)
        for key, value in config.items():
            p = params.get(key)
            if p is None:
                raise UserError(f"{key!r} is not a param of this space", file=self.source, field="--fixed")
            ok = (value in p.choices if isinstance(p, CategoricalParam)
                  else is_number(value)
                  and p.low <= value <= p.high)
            if not ok:
                raise UserError(f"{key}={value!r} is outside the space", file=self.source, field="--fixed")
            if isinstance(p, IntParam) and value != int(value):
                raise UserError(f"{key}={value!r}: {key} is an int param", file=self.source, field="--fixed")
            params[key] = CategoricalParam(type="categorical", choices=[value], when=p.when)
        params, fixed = self._active_under(params)
        data = {**self.model_dump(), "params": {k: p.model_dump() for k, p in params.items()}, "fixed": fixed}
        try:  # every check a space file gets (a --fixed value is a value of the space)
            space = parse_space(data, source=self.source or "<space>")
        except UserError as e:
            given = ", ".join(f"{k}={v!r}" for k, v in config.items())
            raise UserError(f"{given}: {e.field}: {e.message}" if e.field else f"{given}: {e.message}",
                            file=self.source, field="--fixed") from None
        return space.model_copy(update={"source": self.source})

    def _active_under(self, params: dict[str, Param]) -> tuple[dict[str, Param], dict[str, Any]]:
        """``params`` and this space's ``fixed`` without what can never be active (see
        :meth:`pinned`)."""
        from archsearch.dynamic import settings_owners

        params = dict(params)
        changed = True
        while changed:  # a dropped param can make another's condition impossible
            changed = False
            for key, p in list(params.items()):
                when = {}
                for dep, val in (p.when or {}).items():
                    d = params.get(dep)
                    left = [v for v in (val if isinstance(val, list) else [val])
                            if d is not None and v in d.choices]
                    when[dep] = left if isinstance(val, list) else (left[0] if left else None)
                if any(v in (None, []) for v in when.values()):
                    del params[key]
                    changed = True
                elif when != (p.when or {}):
                    params[key] = p.model_copy(update={"when": when})
        picks = {}
        for kind, default in (("gating", "static"), ("tying", "none")):
            given = params.get(kind)
            picks[kind] = set(given.choices) if given is not None and hasattr(given, "choices") \
                else {self.fixed.get(kind, default)}
        owners = settings_owners()

        def used(key: str) -> bool:
            return key not in owners or any(name in picks[kind] for kind, name in owners[key])

        return ({k: p for k, p in params.items() if used(k)},
                {k: v for k, v in self.fixed.items() if used(k)})


def parse_fixed(text: str) -> dict[str, Any]:
    """The ``--fixed`` option's JSON object of param values (for :meth:`SearchSpace.pinned`).

    Raises:
        UserError: ``text`` is not JSON, or not a JSON object.
    """
    import json

    try:
        pinned = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"not valid JSON ({e.msg})", field="--fixed") from None
    if not isinstance(pinned, dict):
        raise UserError("expected a JSON object of param values", field="--fixed")
    return pinned


class _Conditional:
    """``tune.sample_from`` callable: sample ``dom`` only when ``key``'s condition holds."""

    def __init__(self, space: SearchSpace, key: str, dom):
        self.space, self.key, self.dom = space, key, dom

    def __call__(self, spec):
        cfg = dict(spec.config) if hasattr(spec, "config") else dict(spec)
        return self.dom.sample() if self.space.active(self.key, cfg) else None


class _FieldError(ValueError):
    """Raised inside validators to point at an exact field."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(message)


def _field_of(err: dict) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    # pydantic puts the union member tag (e.g. "int", "float") into loc; drop it.
    out = []
    for i, p in enumerate(loc):
        if i >= 2 and loc[0] == "params" and p in ("int", "float", "categorical") and i == 2:
            continue
        if i == len(loc) - 1 and i >= 2 and p in ("int", "float", "str", "bool") \
                and (loc[0] == "fixed" or "choices" in loc or "when" in loc):  # a Scalar's member
            continue
        out.append(p)
    return ".".join(out)


def parse_space(data: Any, source: str = "<space>") -> SearchSpace:
    """Validate an already-parsed YAML mapping. Raises :class:`UserError` on any mistake."""
    if not isinstance(data, dict):
        raise UserError("the file must hold a mapping (key: value) at the top level", file=source)
    params = data.get("params")
    if isinstance(params, dict):
        for key, p in params.items():
            if not isinstance(p, dict):
                raise UserError("must be a mapping with a 'type'", file=source, field=f"params.{key}")
            t = p.get("type")
            if t not in ("int", "float", "categorical"):
                raise UserError(f"unknown parameter type {t!r}; use int, float or categorical",
                                file=source, field=f"params.{key}.type")
    try:
        space = SearchSpace.model_validate({**data, "source": source})
    except _FieldError as e:
        raise UserError(e.message, file=source, field=e.field) from None
    except ValidationError as e:
        err = e.errors()[0]
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _FieldError):
            raise UserError(ctx_err.message, file=source, field=ctx_err.field) from None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        loc = tuple(err.get("loc", ()))
        if len(loc) > 1 and loc[-1] == "int" and err["type"] == "int_type":  # no Scalar took it
            what = ("one of that param's choices or a list of them" if "when" in loc[:-2]
                    else "a number, a string or a boolean")
            err, msg = {**err, "loc": loc[:-1]}, f"expected {what}, got {_kind(err.get('input'))}"
        raise UserError(msg, file=source, field=_field_of(err) or None) from None
    return space


def _kind(value: Any) -> str:
    """``a mapping``, ``a list``, ``null``...: what a YAML value is, for a message."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"



class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice (plain YAML keeps
    the last one: a second ``params:`` block silently replaced the first)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader refuses it itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (the later one would silently win)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space YAML file (``yaml.safe_load``).

    Raises:
        UserError: missing/unreadable file, malformed YAML, or any invalid field; the message
            names the file and the dotted field.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError("file not found", file=str(path)) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e.__class__.__name__}", file=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"not UTF-8: byte 0x{raw[e.start]:02x} at line {line}, column {col}; save "
                        "the file as UTF-8", file=str(path)) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # yaml.safe_load, duplicate keys refused
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(e, "problem", None)
        if problem is None and isinstance(e, yaml.reader.ReaderError):  # a control character
            where = f"line {text.count(chr(10), 0, e.position) + 1}, column " \
                    f"{e.position - (text.rfind(chr(10), 0, e.position) + 1) + 1}"
            problem = f"{e.reason} (character #x{e.character:04x})" if isinstance(e.character, int) \
                else e.reason
        raise UserError(f"malformed YAML: {problem or ' '.join(str(e).split())}", file=str(path),
                        field=where) from None
    return parse_space(data, source=str(path))
