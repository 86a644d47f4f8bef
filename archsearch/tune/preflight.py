"""Every check a search makes before anything is launched, in one place.

:func:`archsearch.tune.runner.start_run` calls :func:`check_search`, which runs::

    space = check_launch(space, searcher=..., address=..., trials=..., ...)   # no data needed
    data = prepare_for_space(space)                                          # the dataset (UserError)
    check_constraints(space, data)                                           # costs of the smallest model

and then, once Ray is up (local or ``--address``) and before the run directory is made,
:func:`check_resources`: one trial's ``budget.cpus_per_trial`` / ``gpus_per_trial`` /
``memory_per_trial_gb`` against the cluster's nodes (an error on a fixed cluster, a warning on an
autoscaling one, whose trials then wait at most ``budget.pending_timeout_s``:
:class:`archsearch.tune.pending.PendingWatch`). ``archsearch check`` runs the same checks without
starting Ray, with the resources of this machine (:func:`local_resources`) for the last one.

:func:`check_launch` runs, in this order (the first mistake is the one reported):

1. the searcher name (:func:`archsearch.tune.searchers.check_searcher`);
2. the command line's budget overrides, validated like the YAML's budget (:func:`effective_space`);
3. the Ray address (:func:`archsearch.tune.ray_session.check_address`);
4. local paths made absolute, since trials run in their own directories (:func:`absolute_local_paths`);
5. the architecture's sizes under :data:`ARCH_LIMITS` (:func:`check_architecture`);
6. every ``init_from`` the space can produce, without loading a tensor (:func:`check_init_from`);
7. every ``distill_teacher``: with an ``init_from``, a readable ``torch.save`` file
   (:func:`check_distill_teacher`);
8. a pretrained ``dataset.tokenizer`` (:func:`check_tokenizer`).

:func:`check_constraints` then refuses ``max`` constraints on known costs that even the
smallest architecture cannot meet (under a FLOPs budget too), and ``min`` ones that even the
largest cannot. The run directory itself
(existing name, unwritable storage) is checked by :meth:`archsearch.runs.RunDir.create`.

The low-level checks stay with what they check: a checkpoint directory in
:func:`archsearch.models.pretrained.check_checkpoint`, a tokenizer argument in
:func:`archsearch.data.tokenizer.check_tokenizer_arg`; this module walks the search space and
calls them. Every refusal is one :class:`~archsearch.errors.UserError` naming the space file
(or the command-line option) and the field.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from archsearch.errors import UserError
from archsearch.metrics import KNOWN_COSTS, is_number
from archsearch.space import CategoricalParam, SearchSpace
from archsearch.tune.ray_session import check_address
from archsearch.tune.searchers import check_searcher


def check_launch(space: SearchSpace, *, searcher: str, address: str | None,
                 trials: int | None = None, cpus_per_trial: float | None = None,
                 gpus_per_trial: float | None = None) -> SearchSpace:
    """Every check that needs no data (the module docstring lists them, in order).

    Returns:
        the space to run: the command line's overrides in its budget, local paths absolute.

    Raises:
        UserError: unknown searcher, bad ``--trials`` / ``--cpus-per-trial`` /
            ``--gpus-per-trial``, unreachable ``address``, a bad checkpoint or tokenizer.
    """
    check_searcher(searcher)
    space = effective_space(space, trials=trials, cpus_per_trial=cpus_per_trial,
                            gpus_per_trial=gpus_per_trial)
    check_address(address)
    space = absolute_local_paths(space)
    check_architecture(space)
    check_init_from(space)
    check_distill_teacher(space)
    check_tokenizer(space)
    return space


# ---------------------------------------------------------------------- architecture
#: The largest value each architecture key may take: far beyond any model trained here, and
#: below what a typo (``n_layers: 3e9``) would hang the pre-launch costing on (the smallest
#: model is built layer by layer on the ``meta`` device) or crash every trial with.
ARCH_LIMITS = {"n_layers": 1024, "d_model": 65536, "n_heads": 1024, "d_ffn": 1 << 20,
               "d_ffn_mult": 256}


def check_architecture(space: SearchSpace) -> None:
    """Every value the space can give an architecture key (``fixed``, a categorical's choices,
    an int/float param's ``low`` and ``high``) is at most its :data:`ARCH_LIMITS`.

    Raises:
        UserError: naming the space file and the field (``params.n_layers.high``).
    """
    for key, limit in ARCH_LIMITS.items():
        for fld, value in space._values(key):
            if is_number(value) and value > limit:
                raise UserError(f"{key} {value:g} is over the limit of {limit:,}: a typo?",
                                file=space.source, field=fld)


def check_search(space: SearchSpace, *, searcher: str, address: str | None,
                 trials: int | None = None, cpus_per_trial: float | None = None,
                 gpus_per_trial: float | None = None):
    """Every check before Ray starts: :func:`check_launch`, the dataset
    (:func:`archsearch.data.prepare_for_space`), then :func:`check_constraints`.

    Returns:
        ``(space, data)``: the space to run (as :func:`check_launch`) and its prepared data.

    Raises:
        UserError: the first mistake found, naming its file and field.
    """
    from archsearch.data import prepare_for_space

    space = check_launch(space, searcher=searcher, address=address, trials=trials,
                         cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial)
    data = prepare_for_space(space)
    check_constraints(space, data)
    return space, data


# ---------------------------------------------------------------------- budget
def effective_space(space: SearchSpace, *, trials: int | None = None,
                    cpus_per_trial: float | None = None,
                    gpus_per_trial: float | None = None) -> SearchSpace:
    """``space`` with the command line's overrides folded into its budget.

    Raises:
        UserError: an override the YAML's budget would refuse, naming its option
            (``--cpus-per-trial``).
    """
    update = {k: v for k, v in (("trials", trials), ("cpus_per_trial", cpus_per_trial),
                                ("gpus_per_trial", gpus_per_trial)) if v is not None}
    if not update:
        return space
    from pydantic import ValidationError

    try:  # validated like the YAML's budget (model_copy alone would not check it)
        budget = type(space.budget).model_validate({**space.budget.model_dump(), **update})
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(err["msg"], field=f"--{str(err['loc'][0]).replace('_', '-')}") from None
    return space.model_copy(update={"budget": budget})


# ---------------------------------------------------------------------- paths
def _trained_tokenizer(value: Any) -> bool:
    """``dataset.tokenizer`` is unset or a kind trained here (not a checkpoint)."""
    from archsearch.data.tokenizer import TRAINED_KINDS

    return value is None or value in TRAINED_KINDS


#: Settings whose values are local paths (or Hub ids): made absolute by :func:`absolute_local_paths`.
PATH_KEYS = ("init_from", "distill_teacher")


def absolute_local_paths(space: SearchSpace) -> SearchSpace:
    """``space`` with every ``init_from`` and ``distill_teacher`` (``fixed`` and the choices of
    ``params``), a
    ``dataset.tokenizer`` and a ``dataset.name`` that name an existing local path made absolute:
    relative paths mean "from the directory the command runs in", and trials run elsewhere (Ray
    starts each in its own directory), as does a resumed run (it reads the run's
    ``space.yaml``). Hub ids and bundled dataset names (no such path) are left alone."""
    def absolute(v):
        if isinstance(v, str) and v and not Path(v).expanduser().is_absolute() and Path(v).expanduser().exists():
            return str(Path(v).expanduser().resolve())
        return v

    update: dict[str, Any] = {}
    for key in PATH_KEYS:
        if key in space.fixed:
            update["fixed"] = {**update.get("fixed", space.fixed), key: absolute(space.fixed[key])}
        param = space.params.get(key)
        if getattr(param, "choices", None) is not None:
            new = param.model_copy(update={"choices": [absolute(c) for c in param.choices]})
            update["params"] = {**update.get("params", space.params), key: new}
    data_update: dict[str, Any] = {}
    tok = space.dataset.tokenizer
    if not _trained_tokenizer(tok) and absolute(tok) != tok:
        data_update["tokenizer"] = absolute(tok)
    from archsearch.data.names import bundled_names

    name = space.dataset.name
    if isinstance(name, str) and name not in bundled_names() and absolute(name) != name:
        data_update["name"] = absolute(name)
    if data_update:
        update["dataset"] = space.dataset.model_copy(update=data_update)
    return space.model_copy(update=update) if update else space


# ---------------------------------------------------------------------- checkpoints, tokenizer
def check_init_from(space: SearchSpace) -> None:
    """Check every ``init_from`` a search space can produce: ``fixed.init_from`` and each
    choice of ``params.init_from`` (falsy values mean "train from scratch"), each with
    :func:`archsearch.models.pretrained.check_checkpoint` (no tensor is loaded). With a
    checkpoint the task must be classification and ``dataset.tokenizer`` a checkpoint
    directory or Hub id (its own tokenizer), as
    :func:`archsearch.models.pretrained.transformer_for_data` requires (the tokenizer itself
    is checked by :func:`check_tokenizer`). Every ``n_layers`` the space can pair with a
    checkpoint (``fixed.n_layers``, or the range / choices of ``params.n_layers``; when its
    ``when:`` names ``init_from``, only with those checkpoints) must be a static cut of it:
    ``1 ..`` its layer count.

    Raises:
        UserError: naming the space file and ``fixed.init_from``, ``params.init_from``,
            ``task``, ``dataset.tokenizer``, ``fixed.n_layers`` or ``params.n_layers``.
    """
    values: list[tuple[str, Any]] = []
    if "init_from" in space.fixed:
        values.append(("fixed.init_from", space.fixed["init_from"]))
    if "init_from" in space.params:
        param = space.params["init_from"]
        choices = getattr(param, "choices", None)
        if choices is None:
            raise UserError("must be a categorical of checkpoint directories", file=space.source,
                            field="params.init_from")
        values += [("params.init_from", c) for c in choices]
    values = [(f, v) for f, v in values if v]
    if not values:
        return
    from archsearch.models.pretrained import check_checkpoint

    depths: dict[str, int] = {}  # checkpoint -> its layer count
    for fld, value in values:
        if not isinstance(value, str):
            raise UserError(f"expected a checkpoint directory or Hub model id, got {value!r}",
                            file=space.source, field=fld)
        depths[value] = check_checkpoint(value, file=space.source, field=fld,
                                         max_len=space.dataset.max_len).n_layers
    if space.task != "classification":
        raise UserError(f"init_from supports classification only, the task is {space.task!r}",
                        file=space.source, field="task")
    if _trained_tokenizer(space.dataset.tokenizer):
        raise UserError(f"init_from needs the checkpoint's own tokenizer: set dataset.tokenizer to "
                        f"the checkpoint directory ({values[0][1]})", file=space.source,
                        field="dataset.tokenizer")
    _check_cut_depths(space, depths)


def check_distill_teacher(space: SearchSpace) -> None:
    """Check every ``distill_teacher`` a search space can produce (``fixed`` and the choices of
    ``params``; falsy values mean "no teacher"), without loading a tensor: the space must give
    an ``init_from`` (the teacher's architecture, as
    :func:`archsearch.dynamic.depth.exits.load_teacher` requires) and the path must be a readable
    file in one of ``torch.save``'s formats (a zip archive, or the legacy pickle stream). What
    it holds is checked when a trial loads it.

    Raises:
        UserError: naming the space file and ``fixed.distill_teacher`` or
            ``params.distill_teacher``.
    """
    import zipfile

    values = [("fixed.distill_teacher", space.fixed["distill_teacher"])] if "distill_teacher" in space.fixed else []
    values += [("params.distill_teacher", c) for c in getattr(space.params.get("distill_teacher"), "choices", None) or []]
    values = [(f, v) for f, v in values if v]
    if not values:
        return
    init = [space.fixed.get("init_from")] + list(getattr(space.params.get("init_from"), "choices", None) or [])
    for fld, value in values:
        if not any(init):
            raise UserError("needs init_from (the teacher's architecture): the space gives none",
                            file=space.source, field=fld)
        path = Path(str(value)).expanduser()
        if not path.is_file():
            raise UserError(f"no such file: {value}", file=space.source, field=fld)
        try:
            with open(path, "rb") as f:  # the legacy format: a pickle stream (protocol 2+)
                ok = zipfile.is_zipfile(path) or f.read(2)[:1] == b"\x80"
        except OSError as e:
            raise UserError(f"cannot read {value}: {e.strerror or e.__class__.__name__}",
                            file=space.source, field=fld) from None
        if not ok:
            raise UserError(f"{value} is not a torch.save file", file=space.source, field=fld)


def _check_cut_depths(space: SearchSpace, depths: dict[str, int]) -> None:
    """Refuse an ``n_layers`` of ``space`` outside ``1 ..`` the layer count of a checkpoint it
    can be paired with (``depths``: checkpoint -> layers; see :func:`check_init_from`).

    Raises:
        UserError: naming the space file and ``fixed.n_layers`` or ``params.n_layers``.
    """
    if "n_layers" in space.fixed:
        fld, values, only = "fixed.n_layers", [space.fixed["n_layers"]], None
    elif "n_layers" in space.params:
        param = space.params["n_layers"]
        choices = getattr(param, "choices", None)
        values = list(choices) if choices is not None else [param.low, param.high]
        fld, only = "params.n_layers", (param.when or {}).get("init_from")
    else:
        return
    numbers = [v for v in values if is_number(v)]
    if not numbers:
        return  # not a number: the model config refuses it
    lo, hi = min(numbers), max(numbers)
    if only is not None:
        only = only if isinstance(only, list) else [only]
    for ckpt, layers in depths.items():
        if only is not None and ckpt not in only:
            continue
        if lo < 1 or hi > layers:
            span = f"{lo}" if lo == hi else f"{lo} .. {hi}"
            raise UserError(f"n_layers {span} with init_from {ckpt}: a static cut keeps 1 .. "
                            f"{layers} of its {layers} layers", file=space.source, field=fld)


def check_tokenizer(space: SearchSpace) -> None:
    """A ``dataset.tokenizer`` that names a checkpoint directory or Hub id must be one that
    can be had, with tokenizer files (a Hub id is resolved here: from the cache, else
    downloaded); the trained kinds are checked when the data is prepared.

    Raises:
        UserError: as :func:`archsearch.data.tokenizer.check_tokenizer_arg`, naming the space
            file and ``dataset.tokenizer``.
    """
    if _trained_tokenizer(space.dataset.tokenizer):
        return
    from archsearch.data.tokenizer import check_tokenizer_arg

    check_tokenizer_arg(space.dataset.tokenizer, file=space.source, field="dataset.tokenizer")


# ---------------------------------------------------------------------- constraints
#: Above this many configurations (:func:`extreme_configs`), :func:`check_constraints` checks
#: nothing rather than guess which ones to cost.
MAX_CHOICE_COMBINATIONS = 1024


#: Numeric params whose known costs never fall as they grow: the low end is the cheapest.
GROWING = frozenset({"n_layers", "d_model", "n_heads", "d_ffn", "d_ffn_mult", "flops_budget"})
#: Numeric params that change no known cost: one end stands for all.
COST_FREE = frozenset({"lr", "dropout", "weight_decay", "warmup_steps", "label_smoothing",
                       "batch_size"})


def _ends(key: str, p, largest: bool) -> list[Any] | None:
    """The values of a numeric param (or all-numeric categorical) the check must cost: its low
    (``largest``: high) end when the costs grow with it (:data:`GROWING`) or do not depend on
    it (:data:`COST_FREE`); both ends otherwise (a gating setting such as ``min_layers``: more
    of it, fewer exit heads). ``None`` for a categorical with a non-numeric choice."""
    if isinstance(p, CategoricalParam):
        if not all(is_number(c) for c in p.choices):
            return None
        low, high = min(p.choices), max(p.choices)
    else:
        low, high = p.low, p.high
    if key in GROWING or key in COST_FREE or low == high:
        return [high if largest else low]
    return [low, high]


def extreme_configs(space: SearchSpace, *, largest: bool = False) -> list[dict[str, Any]] | None:
    """Every configuration with the numeric params at the ends :func:`_ends` names (the low,
    ``largest``: high, end of an architecture size) and the active non-numeric categoricals
    (``gating``, ``init_from``, ``tying``...) at each of their choices, ``when`` conditions
    followed (an inactive param branches nothing). ``None`` when there are more than
    :data:`MAX_CHOICE_COMBINATIONS`."""
    keys, out = list(space.params), []

    def walk(i: int, cfg: dict[str, Any]) -> None:
        if len(out) > MAX_CHOICE_COMBINATIONS:
            return
        if i == len(keys):
            out.append(dict(cfg))
            return
        key = keys[i]
        if not space.active(key, cfg):
            walk(i + 1, cfg)
            return
        ends = _ends(key, space.params[key], largest)
        for v in space.params[key].choices if ends is None else ends:
            cfg[key] = v
            walk(i + 1, cfg)
            del cfg[key]

    walk(0, {})
    return None if len(out) > MAX_CHOICE_COMBINATIONS else out


def check_constraints(space: SearchSpace, data) -> None:
    """Refuse constraints that no configuration can meet.

    Known costs (:data:`archsearch.metrics.KNOWN_COSTS`) are computed by the same function the
    searchers use and whose ``flops_per_sample`` the trials report
    (:func:`archsearch.dynamic.known_costs.known_costs_fn`, on the validation batches as
    evaluated), for the extreme architectures under every combination of the non-numeric
    choices (:func:`extreme_configs`: a searched ``gating`` changes the known FLOPs,
    ``flops_budget`` x the static model's under ``dht`` / ``depth_predictor``; an ``init_from``
    choice changes every cost):

    * every ``max`` must hold for the cheapest of them (``params_trainable`` is not checked
      for tying configs: tying can lower it);
    * every ``min`` must hold for the most expensive one (the known costs of a tying config
      are the untied model's, an upper bound, so tying never hides a feasible ``min``).

    A combination the model refuses (e.g. a width its head count does not divide, or settings
    that do not go together) is left out: only costs that can be computed refuse a space.
    With more combinations than :data:`MAX_CHOICE_COMBINATIONS` nothing is checked here (a
    warning says so).

    Args:
        data: the run's :class:`archsearch.data.PreparedData`.

    Raises:
        UserError: naming ``constraints.METRIC.max`` (``.min``), with the smallest (largest)
            achievable value; or ``params`` when no smallest architecture is valid.
    """
    wanted_max = {m: b.max for m, b in space.constraints.items() if m in KNOWN_COSTS and b.max is not None}
    wanted_min = {m: b.min for m, b in space.constraints.items() if m in KNOWN_COSTS and b.min is not None}
    if not wanted_max and not wanted_min:
        return
    from archsearch.dynamic.known_costs import known_costs_fn

    cost_fn = known_costs_fn(data, space.fixed)

    def extremes(largest: bool) -> tuple[list[tuple[dict, dict]], str | None]:
        """(config, costs) of each valid extreme configuration; the first refusal's text."""
        got, first_error = [], None
        configs = extreme_configs(space, largest=largest)
        if configs is None:
            warnings.warn(f"{space.source}: constraints: over {MAX_CHOICE_COMBINATIONS} "
                          "combinations of choices to cost: the bounds on known costs are not "
                          "checked before launch (the trials still report them)", stacklevel=3)
        for cfg in configs or []:
            try:
                got.append((cfg, cost_fn(cfg)))
            except ValueError as e:
                first_error = first_error or str(e)
        return got, first_error

    if wanted_max:
        costed, error = extremes(largest=False)
        if not costed and error is not None:
            raise UserError(f"the smallest architecture is invalid: {error}", file=space.source,
                            field="params")
        lows: dict[str, float] = {}
        for cfg, got in costed:
            if str({**space.fixed, **cfg}.get("tying", "none")) != "none":
                got["params_trainable"] = -math.inf  # tying can lower it: never refused
            for metric, v in got.items():
                lows[metric] = min(lows.get(metric, math.inf), v)
        for metric, bound in wanted_max.items():
            if metric in lows and lows[metric] > bound:
                raise UserError(f"no configuration can meet max {bound:g}: the smallest "
                                f"architecture has {metric} {lows[metric]:,.0f}",
                                file=space.source, field=f"constraints.{metric}.max")
    if wanted_min:
        costed, _ = extremes(largest=True)
        highs: dict[str, float] = {}
        for _, got in costed:
            for metric, v in got.items():
                highs[metric] = max(highs.get(metric, -math.inf), v)
        for metric, bound in wanted_min.items():
            if metric in highs and highs[metric] < bound:
                raise UserError(f"no configuration can meet min {bound:g}: the largest "
                                f"architecture has {metric} {highs[metric]:,.0f}",
                                file=space.source, field=f"constraints.{metric}.min")


# ---------------------------------------------------------------------- resources
#: Budget field -> (Ray resource, unit name, bytes per unit of the field).
RESOURCE_FIELDS = {"cpus_per_trial": ("CPU", "CPU", 1.0),
                   "gpus_per_trial": ("GPU", "GPU", 1.0),
                   "memory_per_trial_gb": ("memory", "GiB of memory", float(2**30))}
#: Budget field -> the command-line option that overrides it.
RESOURCE_OPTIONS = {"cpus_per_trial": "--cpus-per-trial", "gpus_per_trial": "--gpus-per-trial"}


def trial_request(space: SearchSpace) -> dict[str, float]:
    """What one trial asks Ray for, in Ray's resource names (``CPU``, ``GPU``, ``memory`` in
    bytes); zero amounts left out."""
    out = {}
    for fld, (res, _, scale) in RESOURCE_FIELDS.items():
        value = getattr(space.budget, fld, None)
        if value:
            out[res] = float(value) * scale
    return out


def amount_text(res: str, value: float) -> str:
    """``2 CPUs``, ``1 GPU``, ``3.5 GiB of memory``."""
    if res == "memory":
        return f"{value / 2**30:.3g} GiB of memory"
    unit = RESOURCE_FIELDS["cpus_per_trial" if res == "CPU" else "gpus_per_trial"][1]
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def describe_resources(nodes: list[dict[str, float]]) -> str:
    """``2 CPUs, 0 GPUs, 5.1 GiB of memory`` (the sum of ``nodes``, as
    ``ray.cluster_resources()``), with the number of nodes and the most of each per node when
    there are several."""
    def show(r: dict[str, float]) -> str:
        return ", ".join(amount_text(k, r.get(k, 0.0)) for k in ("CPU", "GPU", "memory"))

    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU", "memory")}
    if len(nodes) == 1:
        return show(total)
    largest = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in total}
    return f"{show(total)} on {len(nodes)} nodes, at most {show(largest)} per node"


def fits(request: dict[str, float], nodes: list[dict[str, float]]) -> bool:
    """Whether one node of ``nodes`` has every amount of ``request`` (Ray places a trial's
    resources on one node)."""
    return any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in request.items()) for n in nodes)


def check_resources(space: SearchSpace, nodes: list[dict[str, float]], *, autoscaling: bool,
                    local: bool = False, overridden: tuple[str, ...] = ()) -> str | None:
    """Compare what one trial asks for (:func:`trial_request`: ``budget.cpus_per_trial``,
    ``gpus_per_trial``, ``memory_per_trial_gb``) with the nodes of the Ray cluster, before any
    trial starts. Ray places a trial on one node, so some node must have it all.

    Args:
        nodes: the total resources of each node (:func:`archsearch.tune.ray_session.node_resources`).
        autoscaling: the cluster can add nodes: a request no node has now is a warning (the
            search then relies on ``budget.pending_timeout_s``), not an error.
        local: the cluster is the local Ray this command started (named so in the message).
        overridden: budget fields set on the command line (``cpus_per_trial``...): the error
            names the option instead of the space file's field.

    Returns:
        ``None`` when a node has room for a trial; on an autoscaling cluster the warning line
        to print otherwise.

    Raises:
        UserError: a fixed cluster (local, or ``--address`` without an autoscaler) on which no
            node can ever hold one trial: the search would wait forever.
    """
    request = trial_request(space)
    if fits(request, nodes):
        return None
    largest = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in request}
    short = [k for k, v in request.items() if largest[k] + 1e-9 < v] or list(request)
    res = short[0]
    fld = next(f for f, (r, _, _) in RESOURCE_FIELDS.items() if r == res)
    if fld in overridden:
        file, where = None, RESOURCE_OPTIONS[fld]
    else:
        file, where = space.source, f"budget.{fld}"
    asks = ", ".join(amount_text(k, v) for k, v in request.items())
    cluster = "this machine's local Ray" if local else "the Ray cluster"
    has = f"{cluster} has {describe_resources(nodes)}"
    if autoscaling:
        return (f"warning: {space.source}: {where}: a trial asks for {asks} and no node has "
                f"that now ({has}); the autoscaler must add one: a trial that waits longer "
                f"than budget.pending_timeout_s ({space.budget.pending_timeout_s:g} s) stops "
                "the search")
    if len(nodes) > 1:  # Ray places a trial's resources on one node
        has = f"no node has {'that' if len(short) == 1 else 'all of it'} ({has})"
    gpu_less = res == "GPU" and largest[res] == 0
    fix = "set budget.gpus_per_trial: 0 to train on CPUs" if gpu_less else "lower it"
    if gpu_less and fld in overridden:
        fix = "use --gpus-per-trial 0 to train on CPUs"
    raise UserError(f"a trial asks for {asks}, but {has}, so no trial could ever start; {fix}",
                    file=file, field=where)


def local_resources(num_cpus: int | None = None) -> list[dict[str, float]]:
    """What the local Ray a search starts here (``num_cpus`` CPUs, default all) would have,
    without starting it: Ray's own resolution of this machine's resources (GPUs it detects,
    memory less the object store), or, should that internal API move, ``num_cpus``, the CUDA
    devices torch sees and the machine's memory. One node.
    """
    import os

    cpus = num_cpus or os.cpu_count() or 1
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec(num_cpus=cpus).resolve(is_head=True).to_resource_dict()
        return [{k: float(spec.get(k) or 0.0) for k in ("CPU", "GPU", "memory")}]
    except Exception:  # not this Ray version's internals: estimate as Ray would
        pass
    node = {"CPU": float(cpus)}
    try:
        import torch

        if torch.cuda.is_available():
            node["GPU"] = float(torch.cuda.device_count())
    except Exception:  # no torch or a broken CUDA setup: Ray would see no GPU either
        pass
    try:
        node["memory"] = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        node["memory"] = float("inf")
    return [node]
