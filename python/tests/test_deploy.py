"""`deploy/` checked statically: the Kubernetes manifests render with kustomize and validate
against the Kubernetes schemas (no Kubernetes cluster runs here), and every `stoker` flag the
compose file, the manifests and the Dockerfile use exists in that subcommand's `--help`, so
they cannot drift from the binary. test_compose.py runs the compose stack in Docker."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from conftest import REPO, need_module, need_tool, stoker_bin

yaml = need_module("yaml")

DEPLOY = REPO / "deploy"
# Kustomizations that render on their own; the operator's PodMonitors need its CRDs, which the
# schema validator has no schema for: they are rendered and checked for their kind only.
VALIDATED = [DEPLOY / "k8s", DEPLOY, DEPLOY / "k8s" / "node-sysctls", DEPLOY / "k8s-s3", DEPLOY / "k8s" / "autoscale"]
OPERATOR = DEPLOY / "k8s" / "prometheus-operator"
# The containers of deploy/k8s that run `stoker`.
STOKER_CONTAINERS = {"coordinator", "worker"}


def need(tool: str) -> str:
    return need_tool(tool, "the kubectl client renders kustomizations offline; kubernetes-validate comes with `make test`'s venv")


def kubernetes_validate() -> str:
    """The venv's `kubernetes-validate` (python/requirements-dev.txt), else one on PATH."""
    return shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or need("kubernetes-validate")


def kustomize(kubectl: str, folder: Path) -> str:
    rendered = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, f"kubectl kustomize {folder}: {rendered.stderr}"
    return rendered.stdout


def test_the_kubernetes_manifests_render_and_validate(tmp_path: Path) -> None:
    kubectl = need("kubectl")
    validator = kubernetes_validate()
    for folder in VALIDATED:
        text = kustomize(kubectl, folder)
        objects = [document for document in yaml.safe_load_all(text) if document]
        assert objects, f"{folder} rendered nothing"
        rendered = tmp_path / f"{folder.name}.yaml"
        rendered.write_text(text)
        checked = subprocess.run([validator, "--strict", "--quiet", str(rendered)], capture_output=True, text=True, timeout=300)
        assert checked.returncode == 0, f"{folder}:\n{checked.stdout}{checked.stderr}"
    kinds = {(document["kind"], document["metadata"]["name"]) for document in yaml.safe_load_all(kustomize(kubectl, DEPLOY)) if document}
    for expected in [("StatefulSet", "stoker-coordinator"), ("Deployment", "stoker-worker"), ("ConfigMap", "stoker-grafana-dashboards")]:
        assert expected in kinds, f"{expected} missing from deploy: {sorted(kinds)}"
    monitors = [document for document in yaml.safe_load_all(kustomize(kubectl, OPERATOR)) if document]
    assert monitors and all(document["kind"] == "PodMonitor" for document in monitors), monitors


def test_the_worker_autoscaler_reads_the_metric_the_coordinator_exports() -> None:
    """deploy/k8s/autoscale: the HPA's external metric is the adapter rule's, and the rule
    queries a series the coordinator's metrics module registers."""
    folder = DEPLOY / "k8s" / "autoscale"
    (hpa,) = [document for document in yaml.safe_load_all((folder / "worker-hpa.yaml").read_text()) if document]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "stoker-worker"
    (metric,) = hpa["spec"]["metrics"]
    name = metric["external"]["metric"]["name"]
    (rule,) = yaml.safe_load((folder / "adapter-values.yaml").read_text())["rules"]["external"]
    assert rule["name"]["as"] == name and name in rule["metricsQuery"] and name in rule["seriesQuery"], rule
    assert f'"{name}"' in (REPO / "coordinator" / "src" / "metrics.rs").read_text(), f"the coordinator registers no {name}"


def test_the_validator_refuses_a_made_up_field(tmp_path: Path) -> None:
    """The check above can fail: a manifest with a field Kubernetes does not have is refused."""
    validator = kubernetes_validate()
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 7400, protocl: UDP}]}\n")
    checked = subprocess.run([validator, "--strict", "--quiet", str(bad)], capture_output=True, text=True, timeout=300)
    assert checked.returncode != 0, checked.stdout


def help_flags(subcommand: Tuple[str, ...]) -> Set[str]:
    """The options `--help` lists (its option column, not flags named in the prose)."""
    shown = subprocess.run([stoker_bin(), *subcommand, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, f"stoker {' '.join(subcommand)} --help: {shown.stderr}"
    return set(re.findall(r"^\s+(?:-[a-zA-Z], )?(--[a-z][a-z0-9-]*)", shown.stdout, re.MULTILINE))


def split_invocation(words: List[str]) -> Tuple[Tuple[str, ...], List[str]]:
    """(subcommand words, flags) of `stoker WORDS...`: `dataset add` is two words."""
    subcommand = tuple(words[:1])
    if len(words) > 1 and not words[1].startswith("-") and subprocess.run(
        [stoker_bin(), words[0], words[1], "--help"], capture_output=True, timeout=60
    ).returncode == 0:
        subcommand = tuple(words[:2])
    flags = [word.split("=", 1)[0] for word in words[len(subcommand) :] if word.startswith("--")]
    return subcommand, flags


def shell_invocations(script: str) -> Iterator[List[str]]:
    """Every `stoker ...` command line of a shell script."""
    script = script.replace("\\\n", " ")
    for line in script.splitlines():
        match = re.search(r"(?:^|[;&|]\s*|exec\s+)stoker\s+(.*)$", line.strip())
        if match:
            yield shlex.split(match.group(1), comments=True)


def compose_invocations() -> Iterator[Tuple[str, List[str]]]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        # The Stoker image (not stoker-prometheus, whose flags are Prometheus's).
        image = str(service.get("image", ""))
        command = service.get("command")
        if not image.startswith("${STOKER_IMAGE"):
            continue
        if command and service.get("entrypoint") == ["sh", "-c"]:
            for words in shell_invocations(str(command[0])):
                yield f"compose.yaml service {name}", words
        elif command:
            words = shlex.split(command) if isinstance(command, str) else [str(word) for word in command]
            yield f"compose.yaml service {name}", words


def k8s_invocations() -> Iterator[Tuple[str, List[str]]]:
    kubectl = need("kubectl")
    for folder in VALIDATED:
        for document in yaml.safe_load_all(kustomize(kubectl, folder)):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                # By name: the image is renamed when it is pushed to a registry.
                if container.get("name") not in STOKER_CONTAINERS:
                    continue
                command, args = container.get("command", []), [str(arg) for arg in container.get("args", [])]
                where = f"{folder.relative_to(REPO)} {document['kind']}/{document['metadata']['name']}"
                if command[:2] == ["sh", "-c"]:
                    for words in shell_invocations(args[0]):
                        yield where, words
                else:
                    # The image's entrypoint is `stoker`: args start with the subcommand.
                    yield where, [word for word in command if word != "stoker"] + args


def dockerfile_invocations() -> Iterator[Tuple[str, List[str]]]:
    text = (DEPLOY / "Dockerfile").read_text()
    for instruction in ("CMD", "HEALTHCHECK"):
        for match in re.finditer(rf"^{instruction}\s+(\[.*\])\s*$", text, re.MULTILINE):
            words = yaml.safe_load(match.group(1))
            yield f"Dockerfile {instruction}", [word for word in words if word != "stoker"]
    for match in re.finditer(r"^RUN\s+(.*)$", text, re.MULTILINE):
        for words in shell_invocations(match.group(1)):
            yield "Dockerfile RUN", words


def test_every_stoker_flag_in_deploy_exists_in_help() -> None:
    found: Dict[str, List[str]] = {}
    unknown = []
    cache: Dict[Tuple[str, ...], Set[str]] = {}
    for where, words in [*compose_invocations(), *k8s_invocations(), *dockerfile_invocations()]:
        if not words:
            continue
        if words[0].startswith("-"):
            subcommand, flags = (), [word.split("=", 1)[0] for word in words if word.startswith("--")]
        else:
            subcommand, flags = split_invocation(words)
        known = cache.setdefault(subcommand, help_flags(subcommand))
        found.setdefault(" ".join(subcommand) or "(top level)", []).append(where)
        unknown += [f"{where}: stoker {' '.join(subcommand)} {flag}" for flag in flags if flag not in known]
    assert not unknown, "flags that `--help` does not list:\n" + "\n".join(unknown)
    # Not vacuous: the coordinators and workers of both deployments were found and checked.
    assert len(found.get("coordinator", [])) >= 4 and len(found.get("worker", [])) >= 3, found


def test_a_made_up_flag_is_caught() -> None:
    subcommand, flags = split_invocation(["worker", "--coordinator=a:1", "--no-such-flag", "x"])
    assert subcommand == ("worker",)
    assert "--no-such-flag" in flags and "--no-such-flag" not in help_flags(subcommand)
    # A flag the help text only mentions in prose is not an option of that subcommand.
    assert "--advertise" in help_flags(("worker",)) and "--peers" not in help_flags(("worker",))
    assert split_invocation(["dataset", "add", "train", "/x"])[0] == ("dataset", "add")
