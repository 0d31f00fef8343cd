"""Mutual TLS from Python: a cluster whose nodes hold certificates of a CA made with `stoker
certs`; a trainer with its own certificate (`tls_dir=`) consumes an epoch, and a Loader without
one, with a certificate of another role, or with a revoked one is refused with a ConfigError
(its TLS settings are wrong) whose message says why."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import stoker

from conftest import SAMPLES, Node, run_stoker, start_cluster

SMALL = [stoker.RandomResizedCrop(32)]


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory):
    """A coordinator and a worker with certificates of a fresh cluster CA; its TLS directories."""
    root = tmp_path_factory.mktemp("secure")
    tls = root / "tls"
    run_stoker("certs", "init", "--dir", str(root / "ca"))
    for role in ("coordinator", "worker", "trainer", "admin"):
        # A coordinator certificate names the Raft node id it starts with (the default, 1).
        node_id = ["--node-id", "1"] if role == "coordinator" else []
        run_stoker("certs", "issue", "--dir", str(root / "ca"), "--role", role, *node_id, "--name", f"py-{role}", "--out", str(tls / role))
    # Shards from the plain cluster's helper (it packs once), then a cluster of our own.
    plain = start_cluster(root, workers=0)
    plain.stop()
    logs = root / "logs"
    coordinator = Node(
        ["coordinator", "--listen", "127.0.0.1:0", "--data-dir", str(root / "coordinator"), "--tls-dir", str(tls / "coordinator")],
        logs / "secure-coordinator.log",
    )
    nodes = [coordinator]
    try:
        run_stoker("dataset", "add", "train", str(plain.manifest), "--coordinator", coordinator.addr or "", "--tls-dir", str(tls / "admin"))
        nodes.append(
            Node(
                ["worker", "--coordinator", coordinator.addr or "", "--listen", "127.0.0.9:0", "--threads", "1", "--tls-dir", str(tls / "worker")],
                logs / "secure-worker.log",
            )
        )
        yield coordinator.addr, tls, root
    finally:
        for node in reversed(nodes):
            node.stop()


def test_a_trainer_with_its_certificate_consumes_an_epoch(certified) -> None:
    coordinator, tls, _ = certified
    loader = stoker.Loader(coordinator, "train", batch_size=8, tail="partial", transforms=SMALL, rank=0, world_size=1,
                           job_name=f"secure-{uuid.uuid4().hex[:6]}", timeout=60, tls_dir=tls / "trainer")
    keys = [key for batch in loader for key in batch.keys]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == SAMPLES
    loader.close()


def test_without_a_certificate_or_with_the_wrong_one_a_loader_is_refused(certified) -> None:
    coordinator, tls, _ = certified
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, timeout=10)
    with pytest.raises(stoker.ConfigError, match="no certificate was presented"):
        stoker.Loader(coordinator, "train", insecure=True, **settings)
    with pytest.raises(stoker.ConfigError, match="needs the trainer role"):
        stoker.Loader(coordinator, "train", tls_dir=tls / "worker", **settings)
    with pytest.raises(stoker.ConfigError, match="tls_dir must be a directory"):
        stoker.Loader(coordinator, "train", tls_dir=42, **settings)
    with pytest.raises(stoker.ConfigError, match="exclude each other"):
        stoker.Loader(coordinator, "train", tls_dir=tls / "trainer", insecure=True, **settings)


def test_a_revoked_trainer_certificate_is_refused_at_its_next_connection(certified) -> None:
    coordinator, tls, root = certified
    run_stoker("certs", "issue", "--dir", str(root / "ca"), "--role", "trainer", "--name", "soon-revoked", "--out", str(root / "soon-revoked"))
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, timeout=10, tls_dir=root / "soon-revoked")
    stoker.Loader(coordinator, "train", job_name=f"revoked-{uuid.uuid4().hex[:6]}", **settings).close()
    run_stoker("certs", "revoke", str(root / "soon-revoked"), "--deny-list", str(tls / "coordinator" / "revoked"))
    shown = run_stoker("certs", "show", str(root / "soon-revoked")).stdout
    assert "role      trainer" in shown, shown
    with pytest.raises(stoker.ConfigError, match="revoked"):
        stoker.Loader(coordinator, "train", job_name=f"revoked-{uuid.uuid4().hex[:6]}", **settings)
