"""The Python layer's cost: the same cluster feeds `stoker consume` (the Rust client) and a
Python loop over `stoker.Loader`, alternately, and the script reports each one's images/s and
trainer CPU per batch. The difference in CPU per batch is the Python layer's overhead.

Each trainer is a child process; its CPU is getrusage(RUSAGE_CHILDREN) around it, less the
same trainer's start-up (attach and exit, no epochs), so interpreter and import time do not
count. Release builds: `cargo build --release -p stoker-cli`, and the package from `make wheel`
(pip install target/wheels/stoker-*.whl) or `maturin develop --release`.

Data: $STOKER_BENCH_DATA (a manifest or its folder), default
~/.cache/stoker-data/imagenet-like-10000/wds (../shared/tools/imagenet-like/make.sh).

Cross-host (STOKER_BENCH_NETNS=1, as root): the coordinator and workers run on one host and the
trainers on another, network namespaces joined by a veth pair at MTU $STOKER_BENCH_MTU (1500);
each trainer, Rust and Python, then runs once with batches over a bulk connection (TLS over
TCP, the default) and once over QUIC, and the table gives each one's CPU per batch: the figure
a GPU node's CPUs pay. The namespaces are removed at the end.
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STOKER = str(ROOT / "target" / "release" / "stoker")
BATCH = int(os.environ.get("STOKER_BENCH_BATCH", "256"))
EPOCHS = int(os.environ.get("STOKER_BENCH_EPOCHS", "2"))
ROUNDS = int(os.environ.get("STOKER_BENCH_ROUNDS", "2"))

# A paced trainer: the buffer is full at every call, so one `next()` is the cost of taking a
# received batch out of the Rust client and wrapping it as numpy (the Python layer + the pop).
PACED_TRAINER = """
import json, statistics, sys, time, stoker
coordinator, job, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = stoker.Loader(coordinator, "bench", batch_size=batch, job_name=job, rank=0, world_size=1)
iterator, costs = iter(loader), []
next(iterator)
for _ in range(30):
    time.sleep(0.3)
    started = time.perf_counter()
    next(iterator)
    costs.append(time.perf_counter() - started)
print(json.dumps({"next_us_median": statistics.median(costs) * 1e6, "next_us_max": max(costs) * 1e6}))
"""

PYTHON_TRAINER = """
import json, sys, time, stoker
coordinator, job, batch, epochs, transport = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
loader = stoker.Loader(coordinator, "bench", batch_size=batch, job_name=job, rank=0, world_size=1, batch_transport=transport,
                       transforms=[stoker.RandomResizedCrop(224), stoker.RandomHorizontalFlip()])
# Timed from the first batch to the last, as `stoker consume` reports it.
started, images = None, 0
for epoch in range(epochs):
    loader.set_epoch(epoch)
    for images_, labels in loader:
        started = started or time.perf_counter()
        images += len(labels)
elapsed = time.perf_counter() - started if started else 0.0
print(json.dumps({"images": images, "seconds": elapsed, "images_per_sec": images / elapsed if elapsed else 0.0}))
"""


NETNS = os.environ.get("STOKER_BENCH_NETNS") == "1"
MTU = os.environ.get("STOKER_BENCH_MTU", "1500")
# The two hosts of the cross-host mode: namespaces, and their addresses on the veth pair.
HOSTS = {"cluster": (f"stkpy-{os.getpid()}-c", "10.78.0.1"), "trainer": (f"stkpy-{os.getpid()}-t", "10.78.0.2")}


def on(host):
    """The command prefix that runs a program on `host` (nothing on loopback)."""
    return ["ip", "netns", "exec", HOSTS[host][0]] if NETNS else []


def make_hosts():
    (cluster_ns, cluster_ip), (trainer_ns, trainer_ip) = HOSTS["cluster"], HOSTS["trainer"]
    run = lambda *args: subprocess.run(["ip", *args], check=True)  # noqa: E731
    run("netns", "add", cluster_ns)
    run("netns", "add", trainer_ns)
    run("link", "add", "eth0", "netns", cluster_ns, "type", "veth", "peer", "name", "eth0", "netns", trainer_ns)
    for namespace, ip in ((cluster_ns, cluster_ip), (trainer_ns, trainer_ip)):
        run("-n", namespace, "link", "set", "lo", "up")
        run("-n", namespace, "link", "set", "eth0", "mtu", MTU, "up")
        run("-n", namespace, "addr", "add", f"{ip}/24", "dev", "eth0")


def remove_hosts():
    for namespace, _ in HOSTS.values():
        subprocess.run(["ip", "netns", "del", namespace], check=False, stderr=subprocess.DEVNULL)


def start(args, log, host="cluster"):
    process = subprocess.Popen([*on(host), STOKER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found = threading.Event()
    addr = []

    def pump():
        with open(log, "w") as out:
            for line in process.stderr:
                out.write(line)
                match = re.search(r"listening on (\S+)", line)
                if match and not found.is_set():
                    addr.append(match.group(1))
                    found.set()

    threading.Thread(target=pump, daemon=True).start()
    if not found.wait(30):
        sys.exit(f"stoker {' '.join(args)} did not start (see {log})")
    return process, addr[0]


def child_cpu(cmd):
    """Run cmd; its last stdout line as JSON (with "page_faults" added), and the CPU seconds it
    used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = out.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {}
    report["page_faults"] = after.ru_minflt - before.ru_minflt
    return report, cpu


def rust(coordinator, job, epochs, transport="tcp"):
    cmd = [*on("trainer"), STOKER, "consume", "--coordinator", coordinator, "--dataset", "bench", "--batch-size", str(BATCH),
           "--epochs", str(epochs), "--job", job, "--rank", "0", "--world-size", "1", "--json", "--batch-transport", transport]
    return child_cpu(cmd)


def python(coordinator, job, epochs, transport="tcp"):
    return child_cpu([*on("trainer"), sys.executable, "-c", PYTHON_TRAINER, coordinator, job, str(BATCH), str(epochs), transport])


def main():
    data = Path(os.environ.get("STOKER_BENCH_DATA", Path.home() / ".cache/stoker-data/imagenet-like-10000/wds"))
    manifest = data / "manifest.json" if data.is_dir() else data
    if not manifest.exists():
        sys.exit(f"no dataset at {data}: run ../shared/tools/imagenet-like/make.sh, or set STOKER_BENCH_DATA")
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-python-"))
    nodes = []
    try:
        if NETNS:
            make_hosts()
        ip = HOSTS["cluster"][1] if NETNS else "127.0.0.1"
        coordinator_process, coordinator = start(["coordinator", "--listen", f"{ip}:0", "--data-dir", str(work / "coordinator"), "--metrics-listen", "off"], work / "coordinator.log")
        nodes.append(coordinator_process)
        subprocess.run([*on("cluster"), STOKER, "dataset", "add", "bench", str(manifest), "--coordinator", coordinator], check=True, stdout=subprocess.DEVNULL)
        for index in range(2):
            listen = f"{ip}:0" if NETNS else f"127.0.0.{2 + index}:0"
            worker, _ = start(["worker", "--coordinator", coordinator, "--listen", listen, "--threads", "1", "--metrics-listen", "off"], work / f"worker{index}.log")
            nodes.append(worker)
        time.sleep(1)
        if NETNS:
            cross_host(coordinator)
            return
        _, rust_start = rust(coordinator, "startup-rust", 0)
        _, python_start = python(coordinator, "startup-python", 0)
        rows = {"rust": [], "python": []}
        for round_ in range(ROUNDS):
            for name, run in (("rust", rust), ("python", python)):
                report, cpu = run(coordinator, f"{name}-{round_}", EPOCHS)
                images = report["images"]
                batches = images / BATCH
                startup = rust_start if name == "rust" else python_start
                faults = report["page_faults"] / batches
                rows[name].append({"images_per_sec": report["images_per_sec"], "cpu_us_per_batch": (cpu - startup) / batches * 1e6, "images": images,
                                   "page_faults_per_batch": faults})
                print(f"{name:>6} round {round_}: {report['images_per_sec']:8.0f} img/s, trainer CPU {(cpu - startup) / batches * 1e6:8.0f} us/batch, "
                      f"{faults:6.0f} page faults/batch", file=sys.stderr)
        paced, _ = child_cpu([sys.executable, "-c", PACED_TRAINER, coordinator, "paced", str(BATCH)])
        print(f"python next() on a buffered batch: median {paced['next_us_median']:.0f} us, max {paced['next_us_max']:.0f} us", file=sys.stderr)
        mean = lambda name, key: sum(row[key] for row in rows[name]) / len(rows[name])  # noqa: E731
        summary = {
            "batch_size": BATCH,
            "epochs": EPOCHS,
            "rounds": ROUNDS,
            "rust_images_per_sec": mean("rust", "images_per_sec"),
            "python_images_per_sec": mean("python", "images_per_sec"),
            "python_to_rust": mean("python", "images_per_sec") / mean("rust", "images_per_sec"),
            "rust_cpu_us_per_batch": mean("rust", "cpu_us_per_batch"),
            "python_cpu_us_per_batch": mean("python", "cpu_us_per_batch"),
            "python_overhead_us_per_batch": mean("python", "cpu_us_per_batch") - mean("rust", "cpu_us_per_batch"),
            "rust_page_faults_per_batch": mean("rust", "page_faults_per_batch"),
            "python_page_faults_per_batch": mean("python", "page_faults_per_batch"),
            "python_next_us_median_buffered": paced["next_us_median"],
            "startup_cpu_seconds": {"rust": rust_start, "python": python_start},
        }
        print(json.dumps(summary, indent=1))
    finally:
        for node in nodes:
            node.kill()
            node.wait()
        if NETNS:
            remove_hosts()


def cross_host(coordinator):
    """Each trainer, Rust and Python, over a bulk connection and over QUIC, alternately."""
    starts = {name: run(coordinator, f"startup-{name}", 0)[1] for name, run in (("rust", rust), ("python", python))}
    rows = {}
    for round_ in range(ROUNDS):
        for transport in ("tcp", "quic"):
            for name, run in (("rust", rust), ("python", python)):
                report, cpu = run(coordinator, f"{name}-{transport}-{round_}", EPOCHS, transport)
                batches = report["images"] / BATCH
                per_batch = (cpu - starts[name]) / batches
                rows.setdefault((name, transport), []).append((report["images_per_sec"], per_batch))
                print(f"{name:>6} {transport:>4} round {round_}: {report['images_per_sec']:7.0f} img/s, trainer CPU {per_batch * 1e3:6.1f} ms/batch",
                      file=sys.stderr)
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    summary = {"mtu": int(MTU), "batch_size": BATCH, "epochs": EPOCHS, "rounds": ROUNDS, "batch_mb": BATCH * 224 * 224 * 3 / 1e6}
    for (name, transport), values in rows.items():
        summary[f"{name}_{transport}_images_per_sec"] = mean([images for images, _ in values])
        summary[f"{name}_{transport}_cpu_ms_per_batch"] = mean([cpu for _, cpu in values]) * 1e3
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
