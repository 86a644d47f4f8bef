"""Dynamic length: the Length-Adaptive Transformer (``gating: length_drop``; Kim & Cho, ACL
2021), which drops tokens layer by layer, trained once for every length configuration and
searched for the best ones after training.

Modules:

* ``settings`` -- ``LengthDropSettings`` and the types its fields use (torch-free).
* ``drop`` -- ``gating: length_drop``: sandwich training with LengthDrop / LayerDrop, inference, search.
* ``forward`` -- the forward pass that drops tokens, the significance score, FLOPs of a configuration.
* ``config`` -- length configurations: validation, LengthDrop sampling, smallest / constant-ratio ones.
* ``evolution`` -- the evolutionary search over length configurations (resumable store).

Importing this package imports nothing else.
"""
