"""Lint of ``cluster/``: the files must work as written, although no Docker, Kubernetes or
AWS is at hand here.

Checked: every YAML parses with ``yaml.safe_load_all``; the Dockerfile's COPY sources exist
and pass its ``.dockerignore``; the manifests' images are the tags the Dockerfile and
``cluster/README.md`` build; every entrypoint is a real ``archsearch`` command line (parsed by
the CLI itself) naming a space file that exists in the repository and in the image and
loads; volumes, claims and ``--storage`` agree; Ray and torch versions agree everywhere; and
``kubectl apply --dry-run=client`` accepts the manifests when kubectl can work offline.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

from conftest import ROOT, free_port

CLUSTER = ROOT / "cluster"
KUBERAY = CLUSTER / "kuberay"
DOCKERFILE = CLUSTER / "Dockerfile"
README = CLUSTER / "README.md"
MANIFESTS = sorted(KUBERAY.glob("*.yaml"))
YAMLS = sorted(CLUSTER.rglob("*.yaml")) + sorted(CLUSTER.rglob("*.yml"))


def load(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def walk(obj, key: str):
    """Every value stored under ``key`` anywhere in ``obj``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v, key)


def pod_specs(doc: dict) -> list[dict]:
    """The pod specs of a RayCluster / RayJob (head group and every worker group)."""
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    return [g["template"]["spec"] for g in groups]


def ray_docs() -> list[dict]:
    docs = [d for p in MANIFESTS for d in load(p)]
    return [d for d in docs if d.get("apiVersion", "").startswith("ray.io/")]


# ---------------------------------------------------------------------- the Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


def dockerfile_args() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in dockerfile_instructions() if i == "ARG" and "=" in a)


def image_files() -> dict[str, Path]:
    """Absolute path in the image -> the repository path COPY puts there (files and dirs)."""
    workdir, out = PurePosixPath("/"), {}
    for instr, args in dockerfile_instructions():
        if instr == "WORKDIR":
            workdir = workdir / args
        elif instr == "COPY":
            parts = [a for a in shlex.split(args) if not a.startswith("--")]
            *srcs, dest = parts
            dest_path = workdir / dest
            for s in srcs:
                target = dest_path / Path(s).name if dest.endswith("/") or len(srcs) > 1 else dest_path
                out[str(target)] = ROOT / s
    return out


def in_image(path: str) -> Path | None:
    """The repository file an absolute image path comes from, if a COPY put it there."""
    for dest, src in image_files().items():
        if path == dest:
            return src
        if path.startswith(dest.rstrip("/") + "/"):
            return src / path[len(dest.rstrip("/")) + 1:]
    return None


def documented_tags() -> set[str]:
    """Image tags that ``docker build -t TAG`` lines in the Dockerfile and README build."""
    text = DOCKERFILE.read_text() + README.read_text()
    return set(re.findall(r"docker build [^\n]*?-t\s+(\S+)", text))


def test_every_yaml_parses():
    assert YAMLS, "no YAML under cluster/"
    for path in YAMLS:
        docs = load(path)
        assert docs and all(isinstance(d, dict) for d in docs), path


def test_dockerfile_copy_sources_exist_and_pass_the_dockerignore():
    copies = [a for i, a in dockerfile_instructions() if i == "COPY"]
    assert copies
    ignore = [ln.strip() for ln in (CLUSTER / "Dockerfile.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    for args in copies:
        srcs = [a for a in shlex.split(args) if not a.startswith("--")][:-1]
        for src in srcs:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            excluded = False  # .dockerignore: last matching pattern wins
            for pat in ignore:
                neg = pat.startswith("!")
                if fnmatch.fnmatch(src, pat.lstrip("!")):
                    excluded = not neg
            assert not excluded, f"COPY {src}: excluded by Dockerfile.dockerignore"
    # the project installs from what is copied: pyproject's readme is among it
    assert "README.md" in " ".join(copies) and "pyproject.toml" in " ".join(copies)


def test_torch_is_pinned_and_cpu_by_default():
    args = dockerfile_args()
    assert args["TORCH_INDEX"] == "cpu"
    assert args["TORCH_VERSION"] == importlib.metadata.version("torch").split("+")[0]
    assert "download.pytorch.org/whl/${TORCH_INDEX}" in DOCKERFILE.read_text()


def test_manifest_images_are_the_documented_tags():
    version = importlib.metadata.version("archsearch")
    tags = documented_tags()
    assert f"archsearch:{version}" in tags, tags
    assert all(t.startswith(f"archsearch:{version}") for t in tags), tags
    images = {img for d in ray_docs() for img in walk(d, "image")}
    assert images and images <= tags, images - tags
    for d in ray_docs():  # the head of every cluster runs the CPU image
        assert pod_specs(d)[0]["containers"][0]["image"] == f"archsearch:{version}"


def test_ray_versions_agree():
    ray = importlib.metadata.version("ray")
    base = dockerfile_args()["BASE_IMAGE"]
    assert base.startswith(f"rayproject/ray:{ray}-"), base
    for d in ray_docs():
        spec = d["spec"].get("rayClusterSpec", d["spec"])
        assert spec["rayVersion"] == ray, d["metadata"]["name"]
    launcher = (CLUSTER / "ray-cluster.yaml").read_text()
    assert set(re.findall(r"ray\[default,tune\]==([\w.]+)", launcher)) == {ray}
    cpu_torch = set(re.findall(r'"torch==([\w.]+)" --index-url https://download.pytorch.org/whl/cpu',
                               launcher))
    assert cpu_torch == {dockerfile_args()["TORCH_VERSION"]}


# ---------------------------------------------------------------------- entrypoints
def parse_cli(argv: list[str]):
    """Parse ``archsearch ARGV`` with the real CLI (no command runs); returns the params."""
    import typer.main

    from archsearch.cli import app

    group = typer.main.get_command(app)
    ctx = group.make_context("archsearch", list(argv[:1]), resilient_parsing=False)
    cmd = group.get_command(ctx, argv[0])
    assert cmd is not None, f"no command {argv[0]!r}"
    return cmd.make_context(argv[0], list(argv[1:]), parent=ctx).params


def test_rayjob_entrypoint_is_a_search_of_a_space_in_the_image():
    from archsearch.space import load_space

    jobs = [d for d in ray_docs() if d["kind"] == "RayJob"]
    assert jobs
    for job in jobs:
        argv = shlex.split(job["spec"]["entrypoint"])
        assert argv[0] == "archsearch" and argv[1] == "search"
        params = parse_cli(argv[1:])
        space = str(params["space_file"])
        assert space.startswith("/"), "the job's working directory is not the image's WORKDIR"
        src = in_image(space)
        assert src is not None, f"{space}: no COPY in cluster/Dockerfile puts a file there"
        assert src.is_file(), f"{space} comes from {src}, which does not exist"
        load_space(src)  # a valid space
        assert params["address"] == "auto" and params["progress"] is False
        # a run named SPACE-SEARCHER runs that searcher (the name said tpe; the default, gp, ran)
        assert params["name"] == f"{load_space(src).name}-{params['searcher']}", params
        mounts = [m["mountPath"] for p in pod_specs(job) for c in p["containers"]
                  for m in c.get("volumeMounts", [])]
        for path in (params["storage"], params["reports"]):
            assert any(str(path).startswith(m + "/") for m in mounts), \
                f"{path} is not on a volume every pod mounts"


def test_ray_start_params_are_strings():
    """KubeRay's CRD types rayStartParams as map[string]string: a bare 0 or true is rejected."""
    for d in ray_docs():
        for params in walk(d, "rayStartParams"):
            assert all(isinstance(v, str) for v in params.values()), params


def test_volumes_and_claims_agree():
    claims = {d["metadata"]["name"] for p in MANIFESTS for d in load(p)
              if d.get("kind") == "PersistentVolumeClaim"}
    assert claims
    for d in [d for d in ray_docs()]:
        for pod in pod_specs(d):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for c in pod["containers"]:
                for m in c.get("volumeMounts", []):
                    assert m["name"] in volumes, f"{d['metadata']['name']}: no volume {m['name']}"
            for v in volumes.values():
                if "persistentVolumeClaim" in v:
                    assert v["persistentVolumeClaim"]["claimName"] in claims
    pvc = [d for p in MANIFESTS for d in load(p) if d.get("kind") == "PersistentVolumeClaim"]
    assert all("ReadWriteMany" in d["spec"]["accessModes"] for d in pvc)


def test_dashboards_are_not_exposed():
    for d in ray_docs():
        assert not [s for s in walk(d, "serviceType") if s != "ClusterIP"]
        assert not list(walk(d, "ingress")) and not list(walk(d, "enableIngress"))
    launcher = load(CLUSTER / "ray-cluster.yaml")[0]
    head = " ".join(launcher["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head


def test_ray_up_config_installs_what_it_syncs():
    cfg = load(CLUSTER / "ray-cluster.yaml")[0]
    home = f"/home/{cfg['auth']['ssh_user']}"
    (target, source), = cfg["file_mounts"].items()
    assert source == "." and target == f"{home}/archsearch"
    excluded = " ".join(cfg["rsync_exclude"])
    assert ".venv" in excluded and ".git" in excluded
    installs = [c for node in [cfg, *cfg["available_node_types"].values()]
                for c in node.get("head_setup_commands", []) + node.get("worker_setup_commands", [])
                if "pip install" in c and "archsearch" in c]
    assert installs and all(" ~/archsearch" in c for c in installs)
    for c in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]:
        assert c.startswith("source ~/venv/bin/activate && ")  # `python` of the job entrypoint
    for name, node in cfg["available_node_types"].items():
        assert node["node_config"]["ImageId"], name


def test_readme_names_files_that_exist():
    text = README.read_text()
    for rel in set(re.findall(r"\bcluster/[\w./-]+\w", text)):
        assert (ROOT / rel).exists(), f"cluster/README.md names {rel}, which does not exist"
    for rel in set(re.findall(r"\bsearch_spaces/[\w.-]+\.yaml", text)):
        assert (ROOT / rel).is_file(), rel
    for cmd in ("archsearch submit", "archsearch logs", "ray up", "kubectl apply",
                "bash cluster/local_cluster.sh start"):
        assert cmd in text, cmd


def test_local_cluster_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(CLUSTER / "local_cluster.sh")]).returncode == 0


# ---------------------------------------------------------------------- kubectl
def test_kubectl_client_dry_run(tmp_path):
    kubectl = shutil.which("kubectl") or "/usr/bin/kubectl"
    if not Path(kubectl).exists():
        pytest.skip("kubectl is not installed")
    # a kubeconfig of our own, pointing at a closed port: nothing else is contacted
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lint",
        "clusters": [{"name": "lint", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                              "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "lint", "context": {"cluster": "lint", "user": "lint"}}],
        "users": [{"name": "lint", "user": {"token": "lint"}}]}))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    for manifest in MANIFESTS:
        proc = subprocess.run([kubectl, "apply", "--dry-run=client", "-f", str(manifest)],
                              env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0 and re.search(r"connection refused|openapi|unable to recognize"
                                              r"|couldn't get current server API", proc.stderr):
            pytest.skip("kubectl apply --dry-run=client needs an API server (OpenAPI schema and "
                        "the KubeRay CRDs) even in client mode; none here: "
                        + proc.stderr.strip().splitlines()[-1][:160])
        assert proc.returncode == 0, proc.stderr
