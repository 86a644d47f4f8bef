"""Tying maps: which blocks of a model share weights, and changing that safely.

Used by the tying controllers (:mod:`archsearch.dynamic.tying.controllers`,
:mod:`archsearch.dynamic.tying.rl`); specified in docs/design.md, "Dynamic layer tying".

**Tying state.** A list ``s`` of ``L`` ints (``L`` = number of blocks): ``s[i] = j`` means block
``i`` uses block ``j``'s weights, ``j <= i``; ``s[i] = i`` means block ``i`` has weights no earlier
block uses. The state is *derived from the model* (:func:`tying_map`: ``s[i]`` is the first block
whose Parameters are the very same objects as block ``i``'s), so it is always canonical
(``s[s[i]] == s[i]``) and can never disagree with what is actually shared.

**Real sharing**, two ways. *Shared* (``frozen=False``, ALBERT-style, the default): tying block
``i`` to block ``j`` assigns block ``j``'s ``nn.Parameter`` objects into block ``i``'s modules
(``setattr(module, name, param)``): both blocks then hold the same Parameters, the forward pass
reads one tensor twice, gradients of both uses accumulate into it, the optimizer holds it (and its
Adam state) once, and ``costs.params_trainable`` / ``costs.params_total`` drop. *Frozen alias*
(``frozen=True``, Hay & Wolf's code): block ``i`` gets new Parameters with ``requires_grad=False``
that view the source's memory (``nn.Parameter(p.detach(), requires_grad=False)``): block ``i``
always computes with the source's current weights, but no gradient flows back through its use, and
it has neither gradient nor optimizer state of its own. Untying gives block ``i`` fresh trainable
Parameters holding copies of its current values. Only block ``i``'s own slots change, so the blocks
that shared with ``i`` keep their weights (frozen mode: the first of them becomes trainable on the
same memory, so the group keeps an owner the optimizer updates).

**Optimizer.** After a change during training, :func:`sync_optimizer` rebuilds ``loop.opt`` over
the distinct trainable Parameters (``loop.rebuild_optimizer()`` of the
:class:`~archsearch.dynamic.base.TrialContext`, which also rebuilds the LR schedule at the current
step) and carries the AdamW state of every surviving Parameter over; new copies
start with fresh state, dropped Parameters take theirs with them.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from archsearch.dynamic.base import TrialContext


def model_blocks(model: nn.Module) -> nn.ModuleList:
    """``model.blocks``, the ``L`` transformer blocks a tying map ranges over.

    Raises:
        ValueError: ``model`` has no ``blocks`` ModuleList.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError("layer tying needs a model with an nn.ModuleList `blocks`")
    return blocks


def _slots(block: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(module, name)`` of every parameter of ``block``, in a fixed order."""
    return [(m, n) for _, m in block.named_modules() for n, p in m._parameters.items() if p is not None]


def _where(p: nn.Parameter) -> tuple:
    """Where ``p``'s values live: ``(storage address, offset, shape)``, equal for a Parameter and
    its frozen aliases; on the meta device (no memory) its identity."""
    if p.device.type == "meta":
        return (id(p),)
    return p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape)


def _key(block: nn.Module) -> tuple[tuple, ...]:
    """Where block ``block``'s weights live, per slot (:func:`_where`: shared Parameters and
    frozen aliases of the same weights have equal keys)."""
    return tuple(_where(p) for p in _params(block))


def _params(block: nn.Module) -> list[nn.Parameter]:
    return [getattr(m, n) for m, n in _slots(block)]


def tying_map(model: nn.Module) -> list[int]:
    """The tying state of ``model``: ``s[i]`` = the first block whose weights (the same Parameters,
    or frozen aliases of their memory) are block ``i``'s.

    Returns:
        list of ``L`` ints with ``s[i] <= i`` and ``s[s[i]] == s[i]``.

    Raises:
        ValueError: ``model`` has no ``blocks`` ModuleList.
    """
    keys: list[tuple[int, ...]] = []
    out = []
    for i, block in enumerate(model_blocks(model)):
        k = _key(block)
        out.append(next((j for j, kj in enumerate(keys) if kj == k), i))
        keys.append(k)
    return out


def n_distinct_layers(model: nn.Module) -> int:
    """Number of blocks with their own weights (``s[i] == i``)."""
    return sum(1 for i, j in enumerate(tying_map(model)) if i == j)


def set_layer(model: nn.Module, i: int, j: int, *, frozen: bool = False) -> bool:
    """Make block ``i`` use block ``j``'s weights (``j < i``) or train on its own (``j == i``).

    ``j < i``: block ``i``'s Parameter slots are assigned block ``j``'s Parameter objects (which
    are block ``s[j]``'s), or with ``frozen=True`` frozen aliases of their memory (module
    docstring). ``j == i``: if block ``i`` shares with an earlier block it gets fresh Parameters
    with copies of the current values (``requires_grad`` of the weights' trainable owner, so an
    untied frozen alias trains again); otherwise nothing changes. If block ``i`` owned weights that
    later blocks still use as frozen aliases, the first of those blocks gets trainable Parameters
    on that memory (the group keeps an owner, whatever ``frozen`` says for block ``i``).
    Aliases view the memory the source has when they are made: tie after any device or dtype
    move (``Module.to`` and ``copy.deepcopy`` give aliases memory of their own). No other block
    is modified.

    Returns:
        True if block ``i``'s Parameters changed (the optimizer must then follow).

    Raises:
        ValueError: not ``0 <= j <= i < L``.
    """
    blocks = model_blocks(model)
    if not 0 <= j <= i < len(blocks):
        raise ValueError(f"need 0 <= j <= i < n_layers={len(blocks)}, got i={i}, j={j}")
    s = tying_map(model)
    if j < i:
        src = blocks[s[j]]
        if _key(blocks[i]) == _key(src) and all(
                (p is q) != frozen for p, q in zip(_params(blocks[i]), _params(src), strict=True)):
            return False
        followers = [k for k in range(i + 1, len(blocks)) if s[k] == i] if s[i] == i else []
        if followers and not _params(blocks[followers[0]])[0].requires_grad:
            # block i's weights live on in its frozen-alias followers: give them an owner
            _own(blocks[followers[0]], requires_grad=[p.requires_grad for p in _params(blocks[i])])
        for (mi, name), q in zip(_slots(blocks[i]), _params(src), strict=True):
            setattr(mi, name, nn.Parameter(q.detach(), requires_grad=False) if frozen else q)
        return True
    if s[i] == i:
        return False
    owner = _params(blocks[s[i]])
    for (m, name), q in zip(_slots(blocks[i]), owner, strict=True):
        setattr(m, name, nn.Parameter(getattr(m, name).detach().clone(), requires_grad=q.requires_grad))
    return True


def _own(block: nn.Module, requires_grad: list[bool]) -> None:
    """Give ``block`` Parameters of its own on the memory it already uses (a frozen alias whose
    owner left becomes the owner)."""
    for (m, name), rg in zip(_slots(block), requires_grad, strict=True):
        setattr(m, name, nn.Parameter(getattr(m, name).detach(), requires_grad=rg))


def next_map(s: Sequence[int], i: int, j: int) -> list[int]:
    """The tying state after :func:`set_layer` ``(i, j)`` on a model in state ``s`` (pure).

    Block ``i`` moves to block ``j``'s group (``j < i``) or to a group of its own (``j == i``);
    if block ``i`` owned weights that later blocks share, those blocks keep the weights and the
    first of them becomes their owner.

    Raises:
        ValueError: ``s`` is not a valid map, or not ``0 <= j <= i < len(s)``.
    """
    s = check_map(s, len(s))
    if not 0 <= j <= i < len(s):
        raise ValueError(f"need 0 <= j <= i < {len(s)}, got i={i}, j={j}")
    target = s[j] if j < i else i
    if target == s[i]:
        return s
    out = list(s)
    out[i] = target
    followers = [k for k in range(len(s)) if s[k] == i and k != i]
    for k in followers:  # block i owned these weights: the first follower now owns them
        out[k] = followers[0]
    return out


def check_map(s: Sequence[int], n_layers: int) -> list[int]:
    """Validate a tying state: ``n_layers`` ints, ``0 <= s[i] <= i``, ``s[s[i]] == s[i]``.

    Raises:
        ValueError: wrong length or an entry breaking those rules.
    """
    s = [int(v) for v in s]
    if len(s) != n_layers:
        raise ValueError(f"tying map has {len(s)} entries, expected {n_layers}")
    for i, j in enumerate(s):
        if not 0 <= j <= i:
            raise ValueError(f"tying map entry s[{i}] = {j} must be in [0, {i}]")
        if s[j] != j:
            raise ValueError(f"tying map entry s[{i}] = {j} points at block {j}, which is itself tied "
                             f"to {s[j]}; point at the block that owns the weights")
    return s


def apply_tying_map(model: nn.Module, s: Sequence[int], *, frozen: bool = False) -> bool:
    """Re-tie ``model`` so that :func:`tying_map` returns ``s`` (tied blocks as shared Parameters,
    or with ``frozen=True`` as frozen aliases: :func:`set_layer`).

    Returns:
        True if any Parameter changed.

    Raises:
        ValueError: ``s`` is not a valid map for the model (see :func:`check_map`).
    """
    s = check_map(s, len(model_blocks(model)))
    changed = False
    for i, j in enumerate(s):  # blocks < i already match s and are never touched again
        changed |= set_layer(model, i, j, frozen=frozen)
    return changed


def sync_optimizer(loop: TrialContext | None) -> None:
    """Rebuild ``loop.opt`` (and its LR schedule) after the parameter set changed.

    Calls ``loop.rebuild_optimizer()`` (a fresh AdamW over ``loop.trainable_parameters()``, each
    distinct Parameter once, schedule at the current step) and copies the per-parameter state
    (``step``, ``exp_avg``, ``exp_avg_sq``) of every Parameter the old optimizer also held, or that
    lives on the same memory as one it held (a frozen alias that became its group's owner). New
    Parameters (untied copies) start with empty state; state of Parameters no longer in the model
    is dropped. No-op when ``loop`` is None or has no optimizer yet.
    """
    old = loop.opt if loop is not None else None
    if old is None:
        return
    old_state = old.state
    by_memory = {_where(p): st for p, st in old_state.items()}
    loop.rebuild_optimizer()
    for group in loop.opt.param_groups:
        for p in group["params"]:
            if p in old_state:
                loop.opt.state[p] = old_state[p]
            elif _where(p) in by_memory:  # a new Parameter on the same memory (a frozen alias made owner)
                loop.opt.state[p] = by_memory[_where(p)]



def groups_of(s: Sequence[int]) -> list[list[int]]:
    """The blocks of each group of map ``s``, groups in order of their first block."""
    out: dict[int, list[int]] = {}
    for i, j in enumerate(s):
        out.setdefault(j, []).append(i)
    return list(out.values())


def mean_weights(model: nn.Module, blocks: Sequence[int]) -> list:
    """Per parameter slot, the mean over ``blocks`` of their weights (a block of a shared group
    counts once per block: the mean the blocks compute with on average); detached tensors."""
    import torch

    bl = model_blocks(model)
    with torch.no_grad():
        return [torch.stack([ps[k].detach() for ps in (_params(bl[b]) for b in blocks)]).mean(0)
                for k in range(len(_params(bl[blocks[0]])))]


def merge_blocks(model: nn.Module, blocks: Sequence[int], loop: TrialContext | None = None) -> list[int]:
    """Tie ``blocks`` into one group (shared Parameters, owned by the first block): the group
    takes the blocks' mean weights (:func:`mean_weights`) and, with ``loop``'s AdamW, their mean
    first and second moments (``step``: the largest), so the optimizer goes on where the blocks
    were rather than restarting (issue 67: a tie that keeps what was learned). Other blocks'
    sharing is unchanged.

    Returns:
        The new tying map.

    Raises:
        ValueError: fewer than 2 blocks, blocks that are not whole groups, or a map the merge
            would make invalid (:func:`check_map`); the model is then unchanged.
    """
    import torch

    blocks = sorted(int(b) for b in blocks)
    if len(blocks) < 2:
        raise ValueError(f"merge_blocks needs at least 2 blocks, got {blocks}")
    bl = model_blocks(model)
    s = tying_map(model)
    split = [g for g in groups_of(s) if set(g) & set(blocks) and not set(g) <= set(blocks)]
    if split:
        raise ValueError(f"merge_blocks merges whole groups: {blocks} splits group {split[0]} of map {s}")
    new = check_map([blocks[0] if i in blocks else s[i] for i in range(len(s))], len(s))  # before any change
    owner = _params(bl[blocks[0]])
    weights = mean_weights(model, blocks)
    opt = getattr(loop, "opt", None) if loop is not None else None
    moments = []
    if opt is not None:
        for k, p in enumerate(owner):
            states = [opt.state.get(_params(bl[b])[k]) for b in blocks]
            if all(st and "exp_avg" in st for st in states):
                moments.append({"exp_avg": torch.stack([st["exp_avg"] for st in states]).mean(0),
                                "exp_avg_sq": torch.stack([st["exp_avg_sq"] for st in states]).mean(0),
                                "step": max(st["step"] for st in states)})
            else:
                moments.append(None)
    with torch.no_grad():
        for p, w in zip(owner, weights, strict=True):
            p.copy_(w)
    apply_tying_map(model, new)
    if opt is not None:
        for p, m in zip(owner, moments, strict=True):
            if m is not None:
                opt.state[p].update(m)  # the owner's state: its Parameter object stays
        sync_optimizer(loop)
    return tying_map(model)


def untie_groups(model: nn.Module, s: Sequence[int], loop: TrialContext | None = None) -> list[int]:
    """Split groups back to map ``s`` (whose groups are each inside one of the model's current
    groups) by cloning: every block that owns weights again under ``s`` gets a copy of its current
    group's weights and, with ``loop``'s AdamW, of that group's first and second moments and step
    (issue 67: untie = clone weights and moments, so neither half restarts its optimizer).

    Returns:
        The new tying map (``s``).

    Raises:
        ValueError: ``s`` is not a valid map, or it joins blocks the current map keeps apart.
    """
    s = check_map(s, len(model_blocks(model)))
    cur = tying_map(model)
    joined = [i for i in range(len(s)) if cur[s[i]] != cur[i]]
    if joined:
        raise ValueError(f"untie_groups only splits groups: map {list(s)} ties block {joined[0]} to a block "
                         f"of another group of {cur}")
    bl = model_blocks(model)
    opt = getattr(loop, "opt", None) if loop is not None else None
    src = {i: [(p, None if opt is None else opt.state.get(p)) for p in _params(bl[cur[i]])]
           for i in range(len(s)) if s[i] == i and cur[i] != i}  # new owners: their current group's state
    apply_tying_map(model, s)  # clones the values
    if opt is not None:
        sync_optimizer(loop)
        for i, pairs in src.items():
            for p, (_, st) in zip(_params(bl[i]), pairs, strict=True):
                if st:
                    loop.opt.state[p] = {k: v.clone() if hasattr(v, "clone") else v for k, v in st.items()}
    return tying_map(model)
