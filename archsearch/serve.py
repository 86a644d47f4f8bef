"""Serve an exported model over HTTP on Ray Serve (``archsearch serve DIR``).

One deployment, :func:`build_app`: each replica loads the directory written by
``archsearch export`` (:func:`archsearch.export.load`) and answers ``POST /predict`` with JSON
``{"texts": ["...", ...]}`` -> ``{"predictions": [{"label", "label_name", "probabilities",
"flops", "exit_depth", "regime"}, ...]}`` (one per text, in order; ``flops`` executed, see
:class:`archsearch.export.Prediction`). Each replica's :class:`archsearch.runtime.Runtime`
chooses how a batch runs per (rows, length) by timing on its device (``regime``). Concurrent requests are batched together by
``@serve.batch`` (Ray Serve's dynamic batching: up to ``max_batch_size`` requests, waiting at most
``batch_wait_timeout_s`` for more), so the gating decides per row over one forward pass of
many requests' rows. Bad requests get HTTP 400 and ``{"error": "..."}``.

The HTTP proxy binds 127.0.0.1 by default, as the dashboards do; ``--host 0.0.0.0`` exposes it.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

#: the route of the endpoint
ROUTE = "/predict"
#: at most this many texts in one request
MAX_TEXTS = 4096
#: when adapting with a state file: batches between two saves of the learned state
SAVE_EVERY = 16


def parse_request(body) -> list[str]:
    """The texts of a request body (``{"texts": [str, ...]}``).

    Raises:
        ValueError: anything else (the message is the HTTP 400 answer's ``error``).
    """
    if not isinstance(body, dict) or "texts" not in body:
        raise ValueError('expected a JSON object {"texts": ["...", ...]}')
    texts = body["texts"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError('"texts" must be a list of strings')
    if len(texts) > MAX_TEXTS:
        raise ValueError(f'at most {MAX_TEXTS} texts per request, got {len(texts)}')
    return texts


def build_app(model_dir: str | Path, *, device: str = "cpu", num_cpus: float = 1.0,
              max_batch_size: int = 32, batch_wait_timeout_s: float = 0.005, num_replicas: int = 1,
              regime: str = "auto", adapt: str = "none", state: str | None = None):
    """The Ray Serve application of an exported model (``serve.run(build_app(DIR))``).

    Args:
        model_dir: a directory written by ``archsearch export`` (loaded in each replica).
        device: where each replica runs the model.
        num_cpus: CPUs each replica holds (Ray resources; also its torch threads).
        max_batch_size: requests batched into one forward pass at most (``@serve.batch``).
        batch_wait_timeout_s: how long a batch waits for more requests (s).
        num_replicas: replicas behind the proxy.
        regime: how batches run (:meth:`archsearch.export.ExportedModel.predict_ids`): ``"auto"``
            (timed per rows and length), or ``"cascade"``, ``"static"``, ``"full"``.
        adapt: ``"none"``, ``"dual"`` or ``"bandit"`` (the stop rule keeps following the FLOPs
            budget on the traffic, :mod:`archsearch.runtime`).
        state: when adapting, the file each replica reads its learned state from at
            start (when there) and writes every :data:`SAVE_EVERY` batches and at shutdown
            (several replicas: each keeps its own; the file holds the last one written).
    """
    from ray import serve

    model_dir = str(Path(model_dir).resolve())

    @serve.deployment(name="archsearch-model", num_replicas=num_replicas,
                      ray_actor_options={"num_cpus": num_cpus})
    class ModelServer:
        def __init__(self, directory: str, device: str, threads: int, regime: str, adapt: str,
                     state: str | None):
            import torch

            from archsearch.export import load

            torch.set_num_threads(max(1, threads))
            self.model = load(directory, device=device, adapt=adapt)
            self.regime, self.batches = regime, 0
            self.state = state if adapt != "none" else None
            if self.state:
                self.model.load_state(self.state)

        def __del__(self):  # Ray Serve calls it when the replica shuts down
            if getattr(self, "state", None) and self.batches:
                self.model.save_state(self.state)

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def predict_batch(self, requests: list[list[str]]) -> list[list[dict]]:
            flat = [t for texts in requests for t in texts]
            preds = self.model.predict(flat, batch_size=max(1, len(flat)), regime=self.regime) if flat else []
            self.batches += 1
            if self.state and self.batches % SAVE_EVERY == 0:
                self.model.save_state(self.state)
            out, i = [], 0
            for texts in requests:
                out.append([asdict(p) for p in preds[i:i + len(texts)]])
                i += len(texts)
            return out

        async def __call__(self, request):
            from starlette.responses import JSONResponse

            if request.method != "POST":
                return JSONResponse({"error": f"use POST {ROUTE}"}, status_code=405)
            try:
                body = await request.json()
            except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
                return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            try:
                texts = parse_request(body)
            except ValueError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            return JSONResponse({"predictions": await self.predict_batch(texts)})

    return ModelServer.bind(model_dir, device, int(num_cpus), regime, adapt,
                            None if state is None else str(Path(state).resolve()))


def serve_model(model_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000,
                address: str | None = None, blocking: bool = True, **app_options) -> str:
    """Start Ray (local, or ``address``), Ray Serve's HTTP proxy on ``host:port`` and the model's
    application at :data:`ROUTE`; with ``blocking``, wait until interrupted (Ctrl-C), then shut
    the application down. Returns the endpoint URL.

    Raises:
        UserError: not an export directory (see :func:`archsearch.export.load`, checked here
            before Ray starts).
    """
    import ray
    from ray import serve

    from archsearch.errors import UserError
    from archsearch.export import load
    from archsearch.tune.ray_session import init_ray

    model = load(model_dir, adapt=app_options.get("adapt", "none"))  # every bad-directory (or adapt) error before anything starts
    regime = app_options.get("regime", "auto")
    if regime in ("static", "full") and not model.runtime.dynamic:
        raise UserError(f"regime {regime!r}: this model's gating has no early exits (use auto or cascade)",
                        file=str(model_dir), field="--regime")
    if regime == "static" and model.runtime.static_depth(model.max_len) is None:
        raise UserError("regime 'static': no exit is within the model's FLOPs budget",
                        file=str(model_dir), field="--regime")
    del model
    if not ray.is_initialized():
        init_ray(address, num_cpus=None, dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(model_dir, **app_options), name="archsearch", route_prefix=ROUTE,
              blocking=False)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{ROUTE}"
    if blocking:
        import time

        print(f"serving {model_dir} at {url} (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()
    return url
