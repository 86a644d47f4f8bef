"""Known costs under a FLOPs budget (issue 14): ``known_costs_fn`` reports ``flops_budget`` x the
static full-depth FLOPs for every gating whose settings declare one (``dht``, ``depth_predictor``,
``confidence_exit``; ``dht``'s default budget 0.5 included), adds the default exit heads'
parameters, leaves every other config as it was, keeps budgets apart in its cache, and the
searchers and the pre-launch check see it."""

from __future__ import annotations

import pytest

ARCH = {"n_layers": 3, "d_model": 32, "n_heads": 4}


@pytest.fixture(scope="module")
def data(cache_dir):
    from archsearch.data import prepare

    return prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)


def static_reference(data, cfg):
    """The static model's FLOPs per sample averaged over the validation batches, from the
    analytic count (independent of known_costs_fn's cache)."""
    from archsearch.models.config import eval_lengths, model_config, trial_config
    from archsearch.models.costs import flops_per_sample

    mcfg = model_config(trial_config(cfg), data)
    lengths = eval_lengths(data)
    return sum(n * flops_per_sample(mcfg, T) for T, n in lengths) / sum(n for _, n in lengths)


#: Each budgeted gating's default ``flops_budget`` (None: no budget, the static FLOPs).
DEFAULT_BUDGET = {"dht": 0.5, "depth_predictor": None, "confidence_exit": None}


@pytest.mark.parametrize("gating", sorted(DEFAULT_BUDGET))
def test_a_budget_scales_the_known_flops_of_every_budgeted_gating(data, gating):
    from archsearch.dynamic import gating_class
    from archsearch.dynamic.known_costs import known_costs_fn

    assert gating_class(gating).Settings().flops_budget == DEFAULT_BUDGET[gating]
    cost_fn = known_costs_fn(data)
    static = cost_fn({**ARCH, "gating": "static"})
    full = static_reference(data, ARCH)
    assert static["flops_per_sample"] == pytest.approx(full, rel=1e-12)
    at_04 = cost_fn({**ARCH, "gating": gating, "flops_budget": 0.4})
    assert at_04["flops_per_sample"] == pytest.approx(0.4 * full, rel=1e-12)
    # parameters do not depend on the budget: the Transformer plus the default exit heads (a
    # Linear(32, C) at exits 1 and 2; exit 3 keeps the model's head)
    heads = 2 * (ARCH["d_model"] * data.n_classes + data.n_classes)
    assert at_04["params_total"] == static["params_total"] + heads > heads
    assert at_04["params_trainable"] == static["params_trainable"] + heads
    without_heads = cost_fn({**ARCH, "gating": gating, "flops_budget": 0.4, "exit_heads": False})
    assert (without_heads["params_total"], without_heads["params_trainable"]) == \
        (static["params_total"], static["params_trainable"])
    # the cache is keyed on the model config: budgets asked later still get their own FLOPs,
    # and the static entry is not overwritten by a budgeted one
    assert cost_fn({**ARCH, "gating": gating, "flops_budget": 0.7})["flops_per_sample"] == \
        pytest.approx(0.7 * full, rel=1e-12)
    assert cost_fn({**ARCH, "gating": "static"}) == static
    assert cost_fn({**ARCH, "gating": gating, "flops_budget": 0.4}) == at_04
    # no budget in the config: the gating's default (dht: 0.5; else none, the static model's
    # FLOPs, an upper bound)
    default = cost_fn({**ARCH, "gating": gating})
    assert default["flops_per_sample"] == pytest.approx((DEFAULT_BUDGET[gating] or 1.0) * full, rel=1e-12)
    assert default["params_total"] == at_04["params_total"]
    # the budget and the gating may come from the space's fixed values
    fixed_fn = known_costs_fn(data, {"gating": gating, "flops_budget": 0.5})
    assert fixed_fn(ARCH)["flops_per_sample"] == pytest.approx(0.5 * full, rel=1e-12)
    assert fixed_fn({**ARCH, "flops_budget": 0.25})["flops_per_sample"] == pytest.approx(0.25 * full, rel=1e-12)
    with pytest.raises(ValueError, match="flops_budget"):
        cost_fn({**ARCH, "gating": gating, "flops_budget": 1.5})


def test_other_gatings_ignore_a_flops_budget(data):
    from archsearch.dynamic.known_costs import known_costs_fn

    cost_fn = known_costs_fn(data, {"flops_budget": 0.4})
    full = static_reference(data, ARCH)
    for gating in ("static", "length_drop"):
        assert cost_fn({**ARCH, "gating": gating})["flops_per_sample"] == pytest.approx(full, rel=1e-12)
    assert known_costs_fn(data)(ARCH)["flops_per_sample"] == pytest.approx(full, rel=1e-12)  # default: static


def budget_space(flops_max=None, flops_min=None, gatings=("static", "dht", "depth_predictor")):
    from archsearch.space import parse_space

    spec = {
        "name": "budget",
        "objectives": [{"metric": "accuracy", "mode": "max", "ref": 0.5},
                       {"metric": "flops_per_sample", "mode": "min"}],
        "budget": {"trials": 8},
        "params": {
            "gating": {"type": "categorical", "choices": list(gatings)},
            "flops_budget": {"type": "float", "low": 0.25, "high": 1.0,
                             "when": {"gating": [g for g in gatings if g != "static"]}},
            "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        },
        "fixed": dict(ARCH),
    }
    bound = {k: v for k, v in (("max", flops_max), ("min", flops_min)) if v is not None}
    if bound:
        spec["constraints"] = {"flops_per_sample": bound}
    return parse_space(spec)


def quality(cfg):
    """A deterministic accuracy that falls with the budget (what the searcher learns)."""
    return {"accuracy": 0.8 - 0.2 * (1.0 - float(cfg.get("flops_budget", 1.0)))}


@pytest.mark.slow
def test_qnehvi_sees_the_flops_of_each_budget(data):
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.search import make

    full = static_reference(data, ARCH)
    space = budget_space(flops_max=0.6 * full)
    s = make("qnehvi", space, seed=0, cost_fn=known_costs_fn(data, space.fixed), n_init=3,
             num_restarts=1, raw_samples=16, maxiter=10, mc_samples=16, gp_maxiter=30)
    # the known constraint is judged on the budgeted FLOPs
    assert s.known_feasible({"gating": "dht", "flops_budget": 0.3, "lr": 1e-3})
    assert s.known_feasible({"gating": "depth_predictor", "flops_budget": 0.55, "lr": 1e-3})
    assert not s.known_feasible({"gating": "dht", "flops_budget": 0.8, "lr": 1e-3})
    assert not s.known_feasible({"gating": "static", "lr": 1e-3})
    # trials told without FLOPs get the known FLOPs of their own budget
    for i, (gating, b) in enumerate([("dht", 0.3), ("depth_predictor", 0.5)]):
        cfg = {"gating": gating, "flops_budget": b, "lr": 1e-3}
        s.tell(f"outside-{i}", quality(cfg), config=cfg)
        assert s.observations[-1].metrics["flops_per_sample"] == pytest.approx(b * full, rel=1e-12)
    # its suggestions (Sobol design, then the GP's acquisition over the known FLOPs) meet the
    # bound only a budgeted gating can meet, and each is told the FLOPs of its budget
    flops = []
    for _ in range(5):
        tid, cfg = s.ask()
        assert cfg["gating"] in ("dht", "depth_predictor") and cfg["flops_budget"] <= 0.6, cfg
        s.tell(tid, quality(cfg))
        got = s.observations[-1].metrics["flops_per_sample"]
        assert got == pytest.approx(cfg["flops_budget"] * full, rel=1e-12)
        flops.append(got)
    assert len({round(f) for f in flops}) >= 3  # different budgets, different FLOPs


def test_pre_launch_check_counts_the_budgeted_gatings(data):
    """A FLOPs bound only a budgeted config meets is not refused (the static smallest
    architecture alone would be); one below every budget is."""
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_constraints

    full = static_reference(data, ARCH)
    check_constraints(budget_space(flops_max=0.3 * full), data)  # low end 0.25 meets it
    with pytest.raises(UserError, match=r"constraints\.flops_per_sample\.max"):
        check_constraints(budget_space(flops_max=0.2 * full), data)


def test_pre_launch_check_refuses_a_min_no_configuration_reaches(data):
    """A ``min`` on a known cost is checked against the most expensive architecture under
    every gating choice: with dht's budget capped at 0.6 (dht listed first), the static full
    model still reaches 0.9x its own FLOPs; 1.1x is out of reach of any; without a static
    choice, 0.7x is out of reach of a budget capped at 0.6 and within reach of one at 0.8."""
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_constraints

    def cap(space, high):
        space.params["flops_budget"] = space.params["flops_budget"].model_copy(update={"high": high})
        return space

    full = static_reference(data, ARCH)
    check_constraints(cap(budget_space(flops_min=0.9 * full, gatings=("dht", "static")), 0.6), data)
    check_constraints(budget_space(flops_min=full * 0.999), data)
    with pytest.raises(UserError, match=r"constraints\.flops_per_sample\.min.*largest"):
        check_constraints(budget_space(flops_min=1.1 * full), data)
    with pytest.raises(UserError, match=r"constraints\.flops_per_sample\.min"):
        check_constraints(cap(budget_space(flops_min=0.7 * full, gatings=("dht", "depth_predictor")), 0.6), data)
    check_constraints(cap(budget_space(flops_min=0.7 * full, gatings=("dht", "depth_predictor")), 0.8), data)


def test_extreme_configs_branch_over_the_active_choices_only():
    """The pre-launch check costs each combination of the non-numeric choices a trial can
    have: an inactive param branches nothing (dht_routing only under dht), so many
    conditional choices do not blow the count up and hide init_from-like choices behind a cap
    (the product of every choice list did)."""
    from archsearch.space import parse_space
    from archsearch.tune.preflight import MAX_CHOICE_COMBINATIONS, extreme_configs

    space = parse_space({
        "name": "branches",
        "objectives": [{"metric": "accuracy", "mode": "max"}],
        "params": {
            "gating": {"type": "categorical", "choices": ["static", "dht"]},
            "flops_budget": {"type": "float", "low": 0.25, "high": 0.75, "when": {"gating": "dht"}},
            "dht_routing": {"type": "categorical", "choices": ["once", "cascade"], "when": {"gating": "dht"}},
            "tying": {"type": "categorical", "choices": ["none", "all"]},
            "n_layers": {"type": "int", "low": 1, "high": 4},
        },
        "fixed": {"d_model": 32, "n_heads": 4},
    })
    largest = extreme_configs(space, largest=True)
    assert len(largest) == 6  # static x 2 tying + dht x 2 routing x 2 tying (product: 8)
    assert {(c["gating"], c.get("dht_routing"), c["tying"]) for c in largest} == {
        ("static", None, "none"), ("static", None, "all"), ("dht", "once", "none"),
        ("dht", "once", "all"), ("dht", "cascade", "none"), ("dht", "cascade", "all")}
    assert all(c["n_layers"] == 4 and c.get("flops_budget", 0.75) == 0.75 for c in largest)
    assert all(c["n_layers"] == 1 and c.get("flops_budget", 0.25) == 0.25
               for c in extreme_configs(space))
    assert len(largest) <= MAX_CHOICE_COMBINATIONS


def test_a_combination_the_model_refuses_does_not_refuse_the_space(data):
    """A searched combination a trial would refuse (a distillation teacher without
    ``depth_all_exits``) is left out of the check: the space is refused only when no smallest
    architecture is valid (it was refused when any combination was)."""
    from archsearch.errors import UserError
    from archsearch.space import parse_space
    from archsearch.tune.preflight import check_constraints

    def space(all_exits):
        return parse_space({
            "name": "mixed",
            "objectives": [{"metric": "accuracy", "mode": "max"}],
            "constraints": {"flops_per_sample": {"max": 1e12, "min": 1.0}},
            "params": {"depth_all_exits": {"type": "categorical", "choices": all_exits},
                       "distill_teacher": {"type": "categorical", "choices": ["/tmp/a", "/tmp/b"]},
                       "lr": {"type": "float", "low": 1e-4, "high": 1e-3}},
            "fixed": {"gating": "depth_predictor", "n_layers": 2, "d_model": 32, "n_heads": 4},
        })

    check_constraints(space([False, True]), data)  # False listed first: refused before
    with pytest.raises(UserError, match=r"params: the smallest architecture is invalid: distill_teacher"):
        check_constraints(space([False]), data)


def test_a_setting_whose_high_end_is_cheaper_is_costed_at_both_ends(data):
    """``min_layers`` runs against the architecture: more of it, fewer exit heads, fewer
    parameters. The check costs both its ends, so a bound that min_layers 1 (the most exit
    heads) reaches, or min_layers 4 (the fewest) meets, is not refused; one beyond both is."""
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.errors import UserError
    from archsearch.space import parse_space
    from archsearch.tune.preflight import check_constraints

    fixed = {"gating": "confidence_exit", "exit_heads": True, "n_layers": 4, "d_model": 32, "n_heads": 4}
    cost = known_costs_fn(data, fixed)
    most, fewest = (cost({"min_layers": k})["params_total"] for k in (1, 4))
    assert most > fewest

    def space(**bound):
        return parse_space({
            "name": "exits",
            "objectives": [{"metric": "accuracy", "mode": "max"}],
            "constraints": {"params_total": bound},
            "params": {"min_layers": {"type": "int", "low": 1, "high": 4},
                       "lr": {"type": "float", "low": 1e-4, "high": 1e-3}},
            "fixed": fixed,
        })

    check_constraints(space(min=most), data)  # refused when only min_layers 4 was costed
    check_constraints(space(max=fewest), data)  # refused when only min_layers 1 was costed
    with pytest.raises(UserError, match=r"constraints\.params_total\.min"):
        check_constraints(space(min=most + 1), data)
    with pytest.raises(UserError, match=r"constraints\.params_total\.max"):
        check_constraints(space(max=fewest - 1), data)
