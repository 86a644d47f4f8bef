"""Dynamic layer tying: tying controllers decide during training which blocks share weights
(``tying: all``, ``every_k``, ``switch``, ``merge``, ``rl``, ``paper``; Hay & Wolf, ICLR 2024).

Modules:

* ``settings`` -- the controllers' pydantic ``Settings`` (torch-free).
* ``controllers`` -- the map controllers' base, ``all`` and ``every_k`` (fixed maps), ``switch``, ``merge``.
* ``rl`` -- the Q-learning controllers: ``rl`` (ours) and ``paper`` (paper-inspired: Hay & Wolf's agent, four differences from their code in docs/design.md).
* ``agent`` -- the Q-network, replay buffer, agent and reward of the Q-learning controllers.
* ``maps`` -- tying maps: which blocks share weights, real parameter sharing, the optimizer kept in step.

Importing this package imports nothing else.
"""
