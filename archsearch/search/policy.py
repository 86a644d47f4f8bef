"""AHTO's learned proposal policy: a factorised categorical distribution over a discretised space.

One categorical head per search-space param (docs/design.md, "AHTO outer loop"): a categorical param
has one action per choice, an int param one per value (or ``bins`` evenly spaced values when it
has more), a float param ``bins`` evenly spaced unit-cube bin centres (jittered uniformly within
the bin when sampled). An MLP maps a small state vector built from the GP (incumbent posterior
mean / std, budget used, recent rewards, ...) to the logits of every head.

Training is REINFORCE (Williams 1992, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning", sec. 4) with a moving-average baseline and an entropy
bonus (Williams & Peng 1991): for the action ``a`` a trial took in state ``s`` and its reward
``r`` (the normalised hypervolume improvement the trial produced),
``loss = -(r - b) * log pi(a | s) - beta * H(pi(. | s))``, ``b <- rho b + (1 - rho) r``.
Only the heads of *active* params (conditions) contribute to ``log pi`` and ``H``.

In AHTO the policy *decides*: the acquisition function ranks the candidates (the optimiser's,
the policy's own samples, or a table's unvisited rows) and the policy picks one of the top
``k`` with probability ``q(c | s) = pi(a_c | s) / sum_{c' in top k} pi(a_c' | s)``
(:meth:`FactorisedPolicy.choice_probs`). The update is on-policy for that decision
(:meth:`FactorisedPolicy.update_choice`: ``-(r - b) * log q(c | s)``).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import torch
from torch import nn

STATE_DIM = 6


class FactorisedPolicy(nn.Module):
    """Per-param categorical heads on a shared MLP.

    Args:
        space: the search space (``params``, ``encode``, ``active``).
        bins: actions for a float param / an int param with more values.
        hidden: MLP width.
        lr: Adam learning rate; ``entropy``: entropy bonus ``beta``; ``rho``: baseline decay.
        seed: seeds the weights and the sampling generator.
    """

    def __init__(self, space, *, bins: int = 8, hidden: int = 64, lr: float = 0.01,
                 entropy: float = 0.01, rho: float = 0.9, seed: int = 0):
        super().__init__()
        self.space = space
        self.heads: list[tuple[str, str, list[Any]]] = []  # (param, kind, values)
        for key, p in space.params.items():
            if p.type == "categorical":
                self.heads.append((key, "cat", list(p.choices)))
            elif p.type == "int" and (p.high - p.low) // p.step + 1 <= bins:
                self.heads.append((key, "int", list(range(p.low, p.high + 1, p.step))))
            else:
                self.heads.append((key, "bin", [(i + 0.5) / bins for i in range(bins)]))
        self.sizes = [len(v) for _, _, v in self.heads]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(STATE_DIM, hidden), nn.Tanh(),
                                     nn.Linear(hidden, sum(self.sizes))).double()
            nn.init.zeros_(self.net[2].weight)  # start uniform over every head
            nn.init.zeros_(self.net[2].bias)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.entropy, self.rho = entropy, rho
        self.baseline: float | None = None
        self.gen = torch.Generator().manual_seed(seed + 7919)

    # ------------------------------------------------------------------ distribution
    def logits(self, state: torch.Tensor) -> list[torch.Tensor]:
        """Per-head logits for ``STATE_DIM`` state(s): list of ``(..., size_i)``."""
        return list(torch.split(self.net(state), self.sizes, dim=-1))

    def sample(self, state: Sequence[float], n: int) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """``n`` configs from the policy. Returns ``(configs, actions)``, actions ``n x heads``."""
        s = torch.tensor(list(state), dtype=torch.double)
        with torch.no_grad():
            probs = [torch.softmax(lg, -1) for lg in self.logits(s)]
        acts = torch.stack([torch.multinomial(p, n, replacement=True, generator=self.gen)
                            for p in probs], dim=1)  # (n, heads)
        jitter = torch.rand(n, len(self.heads), generator=self.gen, dtype=torch.double)
        configs = [self._config(acts[i].tolist(), jitter[i].tolist()) for i in range(n)]
        return configs, acts

    def _config(self, act: list[int], jitter: list[float]) -> dict[str, Any]:
        cfg: dict[str, Any] = {}
        for (key, kind, values), a, u in zip(self.heads, act, jitter):
            p = self.space.params[key]
            if kind in ("cat", "int"):
                v = values[a]
            else:
                w = 1.0 / len(values)
                z = min(max(values[a] + (u - 0.5) * w, 0.0), 1.0)
                if p.log:
                    v = math.exp(math.log(p.low) + z * (math.log(p.high) - math.log(p.low)))
                else:
                    v = p.low + z * (p.high - p.low)
                if p.type == "int":
                    v = int(min(max(p.low + round((v - p.low) / p.step) * p.step, p.low), p.high))
            if self.space.active(key, cfg):
                cfg[key] = v
        return cfg

    def actions_of(self, config: dict[str, Any]) -> list[int]:
        """The action index of each head for ``config`` (nearest value / bin; -1 if inactive)."""
        out = []
        x = self.space.encode(config)
        i = 0
        for key, kind, values in self.heads:
            p = self.space.params[key]
            width = len(p.choices) if p.type == "categorical" else 1
            if key not in config:
                out.append(-1)
            elif kind in ("cat", "int"):
                out.append(values.index(config[key]) if config[key] in values else 0)
            else:
                out.append(min(int(x[i] * len(values)), len(values) - 1))
            i += width
        return out

    # ------------------------------------------------------------------ learning
    def update(self, state: Sequence[float], actions: Sequence[int], reward: float) -> float:
        """One REINFORCE step for a finished trial; returns the advantage used."""
        if self.baseline is None:
            self.baseline = float(reward)
            adv = 0.0
        else:
            adv = float(reward) - self.baseline
            self.baseline = self.rho * self.baseline + (1 - self.rho) * float(reward)
        s = torch.tensor(list(state), dtype=torch.double)
        logp, ent = torch.zeros((), dtype=torch.double), torch.zeros((), dtype=torch.double)
        for lg, a in zip(self.logits(s), actions):
            if a < 0:
                continue
            lp = torch.log_softmax(lg, -1)
            logp = logp + lp[a]
            ent = ent - (lp.exp() * lp).sum()
        loss = -adv * logp - self.entropy * ent
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return adv

    def _log_pi(self, state: Sequence[float], candidates: Sequence[Sequence[int]]):
        """``log pi(a_c | s)`` for each candidate's actions (inactive heads, -1, skipped), and
        the per-head log-probabilities. Returns ``((k,), list of (size_i,))``."""
        s = torch.tensor(list(state), dtype=torch.double)
        lps = [torch.log_softmax(lg, -1) for lg in self.logits(s)]
        out = []
        for acts in candidates:
            terms = [lp[a] for lp, a in zip(lps, acts) if a >= 0]
            out.append(torch.stack(terms).sum() if terms else torch.zeros((), dtype=torch.double))
        return torch.stack(out), lps

    def choice_probs(self, state: Sequence[float], candidates: Sequence[Sequence[int]]) -> torch.Tensor:
        """``q(c | s)``: the policy's probabilities renormalised over ``candidates`` (``k``
        action lists, e.g. from :meth:`actions_of`). Returns ``(k,)``."""
        with torch.no_grad():
            logp, _ = self._log_pi(state, candidates)
            return torch.softmax(logp, -1)

    def update_choice(self, state: Sequence[float], candidates: Sequence[Sequence[int]],
                      chosen: int, reward: float) -> float:
        """One REINFORCE step for the decision "candidate ``chosen`` of ``candidates``" taken in
        ``state`` (on-policy for :meth:`choice_probs`); returns the advantage used."""
        if self.baseline is None:
            self.baseline = float(reward)
            adv = 0.0
        else:
            adv = float(reward) - self.baseline
            self.baseline = self.rho * self.baseline + (1 - self.rho) * float(reward)
        logp, lps = self._log_pi(state, candidates)
        logq = torch.log_softmax(logp, -1)[int(chosen)]
        ent = sum(-(lp.exp() * lp).sum() for lp in lps)
        loss = -adv * logq - self.entropy * ent
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return adv

    def get_state(self) -> dict[str, Any]:
        return {"net": {k: v.clone() for k, v in self.net.state_dict().items()},
                "opt": copy.deepcopy(self.opt.state_dict()), "baseline": self.baseline,
                "gen": self.gen.get_state().clone()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.baseline = state["baseline"]
        self.gen.set_state(state["gen"])
