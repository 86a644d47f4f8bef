"""Ray start-up: local Ray on 127.0.0.1, or a connection to a cluster at ``--address``."""

from __future__ import annotations

import os
import socket
import sys

from archsearch.errors import UserError


def ray_env(local: bool = True) -> None:
    """Environment for Ray sessions: no usage stats, Tune's own status table off (archsearch
    draws its own progress), and for a ``local`` Ray no token authentication
    (``RAY_AUTH_MODE=disabled``, docs/design.md's convention; a value the user set, e.g.
    ``token``, wins). Never for a cluster at ``--address``: its own token authentication
    decides (Ray reads ``$RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``); forced off, a search could
    not connect to a cluster that requires a token."""
    if local:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Save Tune's experiment state (trial table + searcher) every second instead of every
    # >= 10 s, so a driver killed soon after a trial started can resume that same trial.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")


def check_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Fail fast when nothing listens at ``--address`` (Ray itself retries for minutes).

    ``auto`` is left to Ray (it fails at once when no local cluster runs); ``HOST:PORT`` and
    ``ray://HOST:PORT`` get a TCP connect with ``timeout_s`` seconds.

    Raises:
        UserError: malformed address, or no answer at HOST:PORT.
    """
    if address is None or address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise UserError("expected auto, HOST:PORT or ray://HOST:PORT", file=address, field="--address")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise UserError(f"no Ray cluster answers there ({e.strerror or e.__class__.__name__})",
                        file=address, field="--address") from None


def init_ray(address: str | None, *, num_cpus: int | None = None, dashboard: bool = False,
             dashboard_host: str = "127.0.0.1") -> None:
    """Start local Ray (``address=None``: ``num_cpus`` CPUs, default all) or connect to a
    cluster. Does nothing when Ray is already initialised in this process.

    Raises:
        UserError: nothing answers at ``address``.
    """
    ray_env(local=address is None)
    import ray

    if ray.is_initialized():
        return
    check_address(address)
    if address is None:
        if dashboard_host not in ("127.0.0.1", "localhost"):
            print(f"warning: Ray dashboard bound to {dashboard_host}: Ray has no authentication; "
                  "anyone who can reach this port can run code on this machine", file=sys.stderr)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                 include_dashboard=dashboard, dashboard_host=dashboard_host,
                 log_to_driver=False, logging_level="ERROR")
        return
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as e:  # Ray raises ConnectionError, RuntimeError or ValueError here
        raise UserError(f"no Ray cluster answers there ({e.__class__.__name__})",
                        file=address, field="--address") from None


def print_dashboards(run_dir, address: str | None, ray_dashboard: bool) -> None:
    """Tell the user (stderr) where the Ray and Optuna dashboards are."""
    if address is None and ray_dashboard:
        import ray

        url = getattr(ray.get_runtime_context(), "dashboard_url", None) or "127.0.0.1:8265"
        print(f"Ray dashboard:    http://{url}", file=sys.stderr)
    print(f"Optuna dashboard: archsearch dashboard {run_dir}", file=sys.stderr)


# ---------------------------------------------------------------------- what the cluster has
#: ``ARCHSEARCH_AUTOSCALING=1`` / ``0`` overrides :func:`cluster_autoscales`' detection.
AUTOSCALING_ENV = "ARCHSEARCH_AUTOSCALING"


def node_resources() -> list[dict[str, float]]:
    """The total resources of every alive node of the connected Ray cluster (``CPU``, ``GPU``,
    ``memory`` in bytes, ...), from ``ray.nodes()``; ``ray.cluster_resources()`` is their sum."""
    import ray

    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def cluster_autoscales(address: str | None) -> bool:
    """Whether the connected cluster can add nodes: never for the local Ray ``address=None``
    starts; otherwise ``$ARCHSEARCH_AUTOSCALING`` (``1``/``0``) when set, else what Ray
    reports: a node group of the autoscaler's cluster config that can grow (autoscaler v2,
    KubeRay; as ``ray.data`` decides), or a v1 autoscaler (``ray up``) managing named node
    types (a head started by hand has a read-only one, whose types are ``node_<id>``)."""
    if address is None:
        return False
    forced = os.environ.get(AUTOSCALING_ENV, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
        if config is not None and any(
                g.max_count == -1 or g.max_count > g.min_count
                for g in config.node_group_configs if g.resources and g.max_count != 0):
            return True
        import json

        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get("__autoscaling_status")
        report = (json.loads(raw) if raw else {}).get("autoscaler_report") or {}
        types = set(report.get("active_nodes") or {}) | set(report.get("pending_launches") or {})
        return any(not (t.startswith("node_") or t == "ray.head.default") for t in types)
    except Exception:  # an older or newer Ray without these internals: assume fixed
        return False
