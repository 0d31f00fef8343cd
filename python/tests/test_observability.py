"""Metrics against a real Prometheus server (Debian's `prometheus` package): a cluster of real
processes (a coordinator, two workers, two `stoker consume` ranks) is scraped with the scrape
config and alert rules of `deploy/prometheus/`; every dashboard panel's queries and every alert
rule's inputs return data, and the stall and throughput series agree with what `stoker consume`
itself reports."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import REPO, need_module, need_tool, run_stoker, start_cluster, stoker_bin, stoker_env

yaml = need_module("yaml")

DEPLOY = REPO / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
RENDER = REPO / "scripts" / "render-dashboard"
# Each rank consumes this many epochs of the test dataset (6 steps of 8 per rank) at this many
# batches per second: ~24 s of training, several 5 s scrapes and 1-minute rate windows' worth.
EPOCHS, RATE, BATCH = 8, 2.0, 8


def need(tool: str) -> str:
    return need_tool(tool, "`make test` installs Debian's prometheus package (scripts/ensure-deps.sh)")


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read().decode()


def query(prometheus: str, expr: str) -> List[dict]:
    answer = json.loads(fetch(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


class Consumer:
    """A `stoker consume` rank with its own metrics endpoint; its JSON report when done."""

    def __init__(self, coordinator: str, job: str, rank: int, log: Path) -> None:
        args = [
            stoker_bin(), "consume", "--coordinator", coordinator, "--dataset", "train", "--job", job,
            "--rank", str(rank), "--world-size", "2", "--batch-size", str(BATCH), "--epochs", str(EPOCHS),
            "--rate", str(RATE), "--size", "32", "--prefetch", "4", "--json", "--metrics-listen", "127.0.0.1:0",
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stoker_env())
        self.metrics: Optional[str] = None
        found = threading.Event()

        def pump() -> None:
            assert self.process.stderr is not None
            with open(log, "a") as out:
                for line in self.process.stderr:
                    out.write(line)
                    match = re.search(r"metrics on http://(\S+)/metrics", line)
                    if match:
                        self.metrics = match.group(1)
                        found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(30):
            self.process.kill()
            raise AssertionError(f"rank {rank} did not serve metrics; see {log}")

    def report(self, timeout: float) -> dict:
        out, _ = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, f"stoker consume failed: {out}"
        return json.loads(out.strip().splitlines()[-1])


def write_prometheus_config(folder: Path, targets: Dict[str, List[str]]) -> Path:
    """deploy/prometheus/ with only the targets of each scrape job replaced by local ones."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(targets) <= set(jobs), f"deploy/prometheus/prometheus.yml lacks scrape jobs {set(targets) - set(jobs)}"
    for name, addresses in targets.items():
        jobs[name]["static_configs"] = [{"targets": addresses}]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEPLOY / "prometheus" / "rules.yml", folder / "rules.yml")
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rule_inputs(expr: str) -> List[str]:
    """The metric names a rule's expression reads (label names in selectors and in `by`,
    `without`, `on`, `ignoring` and `group_*` lists are not metrics)."""
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    return sorted(set(re.findall(r"(?<![\w:])((?:stoker|process)[a-zA-Z0-9_:]*|up)(?![\w:])", expr)))


def test_prometheus_scrapes_a_cluster_and_every_panel_and_rule_has_data(tmp_path: Path, data_root: Path) -> None:
    prometheus_bin, promtool = need("prometheus"), need("promtool")
    cluster = start_cluster(data_root, workers=2)
    prometheus: Optional[subprocess.Popen] = None
    consumers: List[Consumer] = []
    try:
        coordinator, workers = cluster.nodes[0], cluster.nodes[1:]
        assert coordinator.metrics and all(worker.metrics for worker in workers), "every node says where its metrics are"
        job = f"observe-{os.getpid()}"
        consumers = [Consumer(cluster.coordinator, job, rank, tmp_path / f"rank-{rank}.log") for rank in range(2)]
        config = write_prometheus_config(
            tmp_path / "prometheus",
            {
                "stoker-coordinator": [coordinator.metrics],
                "stoker-worker": [worker.metrics for worker in workers],
                "stoker-trainer": [consumer.metrics for consumer in consumers],
            },
        )
        check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        port = free_port()
        server = f"http://127.0.0.1:{port}"
        prometheus = subprocess.Popen(
            [
                prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "w"),
        )
        started = time.time()

        # Each role's exposition passes promtool's lint while the cluster works.
        time.sleep(6)
        for role, addr in (("coordinator", coordinator.metrics), ("worker", workers[0].metrics), ("trainer", consumers[0].metrics)):
            text = fetch(f"http://{addr}/metrics")
            lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
            assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), f"{role}: {lint.stdout}{lint.stderr}"
        # Once the ranks have reported for a few seconds, `stoker status` says what the job asks
        # of the workers: its rate, its stall, the worker cores it wants (issue 35, item 4).
        demand = None
        for _ in range(40):
            status = json.loads(run_stoker("status", "--coordinator", cluster.coordinator, "--json").stdout)
            demand = next((j["demand"] for j in status["jobs"] if j["name"] == job and j["demand"]), None)
            if demand and demand["worker_cores"] is not None or any(c.process.poll() is not None for c in consumers):
                break
            time.sleep(0.5)
        assert demand and demand["samples_per_sec"] > 0 and 0 <= demand["stall"] <= 1 and demand["worker_cores"] > 0, demand
        assert any(worker["images_per_core_sec"] > 0 for worker in status["workers"]), status["workers"]
        shown = run_stoker("status", "--coordinator", cluster.coordinator).stdout
        assert "worker cores:" in shown and "worker cores to serve without stalls" in shown, shown
        reports = [consumer.report(timeout=180) for consumer in consumers]
        # The last progress report went out as each rank detached; one more scrape takes it.
        time.sleep(7)
        end = time.time()

        targets = json.loads(fetch(f"{server}/api/v1/targets"))["data"]["activeTargets"]
        assert len(targets) == 5, targets
        scraped = {target["labels"]["job"] for target in targets if target["lastScrape"] != "0001-01-01T00:00:00Z"}
        assert scraped == {"stoker-coordinator", "stoker-worker", "stoker-trainer"}, targets

        # The stall and the throughput, as Prometheus has them, against what each rank reported.
        for report in reports:
            rank = str(report["rank"])
            selector = f'{{stoker_job="{job}",rank="{rank}"}}'
            samples = query(server, f"max(stoker_trainer_samples_total{selector})")
            waited = query(server, f"max(stoker_trainer_wait_seconds_total{selector})")
            assert samples and waited, f"rank {rank}: no trainer series"
            assert float(samples[0]["value"][1]) == pytest.approx(report["images"], rel=0.10), report
            # Within 10% (and 50 ms, for a stall near zero).
            assert abs(float(waited[0]["value"][1]) - report["wait_seconds"]) <= 0.10 * report["wait_seconds"] + 0.05, (waited, report)
        made = query(server, "sum(stoker_worker_samples_total)")
        consumed = sum(report["images"] for report in reports)
        assert float(made[0]["value"][1]) >= consumed, (made, consumed)

        # Every panel of every dashboard has data over the run (scripts/render-dashboard --check).
        window = ["--start", str(int(started)), "--end", str(int(end) + 1), "--step", "5s", "--var", f"stoker_job={job}"]
        for dashboard in DASHBOARDS:
            checked = subprocess.run(
                [sys.executable, str(RENDER), "--prometheus", server, "--dashboard", str(dashboard), "--check", *window],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert checked.returncode == 0, f"{dashboard.name}:\n{checked.stdout}{checked.stderr}"
            png = tmp_path / f"{dashboard.stem}.png"
            drawn = subprocess.run(
                [sys.executable, str(RENDER), "--prometheus", server, "--dashboard", str(dashboard), "--out", str(png), *window],
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert drawn.returncode == 0 and png.stat().st_size > 10_000, drawn.stdout + drawn.stderr

        # Every alert and recording rule loaded, evaluates without error, and what it reads exists.
        groups = json.loads(fetch(f"{server}/api/v1/rules"))["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert len(rules) >= 5 and any(rule["type"] == "alerting" for rule in rules), groups
        for rule in rules:
            assert rule["health"] in ("ok", "unknown"), rule
            for name in rule_inputs(rule["query"]):
                assert query(server, f"count(last_over_time({name}[10m]))"), f"rule {rule['name']}: no series of {name}"
        deadline = time.time() + 30
        while any(rule["health"] != "ok" for rule in rules) and time.time() < deadline:
            time.sleep(1)
            groups = json.loads(fetch(f"{server}/api/v1/rules"))["data"]["groups"]
            rules = [rule for group in groups for rule in group["rules"]]
        assert all(rule["health"] == "ok" for rule in rules), [rule for rule in rules if rule["health"] != "ok"]
    finally:
        for consumer in consumers:
            if consumer.process.poll() is None:
                consumer.process.kill()
        if prometheus is not None:
            prometheus.send_signal(signal.SIGTERM)
            try:
                prometheus.wait(20)
            except subprocess.TimeoutExpired:
                prometheus.kill()
        cluster.stop()


def test_the_deploy_prometheus_config_and_rules_pass_promtool() -> None:
    promtool = need("promtool")
    for args in (["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")], ["check", "rules", str(DEPLOY / "prometheus" / "rules.yml")]):
        checked = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_loader_serves_its_own_metrics_when_asked(cluster, job_name) -> None:
    import stoker

    small = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]
    with stoker.Loader(cluster.coordinator, cluster.dataset, batch_size=8, transforms=small, rank=0, world_size=1,
                       job_name=job_name, timeout=60, metrics_port=0) as loader:  # fmt: skip
        address = loader.metrics_address
        assert address and address.startswith("0.0.0.0:"), address
        batches = sum(1 for _ in loader)
        port = address.rsplit(":", 1)[1]
        text = fetch(f"http://127.0.0.1:{port}/metrics")
        selector = f'{{rank="0",stoker_job="{job_name}"}}'
        assert f"stoker_loader_batches_total{selector} {batches}" in text, text
        assert f"stoker_loader_samples_total{selector} {8 * batches}" in text, text
        assert fetch(f"http://127.0.0.1:{port}/readyz").strip() == "ready"
        # A second loader on the same port is refused with what to do.
        with pytest.raises(stoker.ConfigError, match="LOCAL_RANK"):
            stoker.Loader(cluster.coordinator, cluster.dataset, batch_size=8, transforms=small, rank=0, world_size=1,
                          job_name=f"{job_name}-2", timeout=60, metrics_port=int(port))  # fmt: skip
    assert loader.metrics_address is None
