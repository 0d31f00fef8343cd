//! Issue 15, item 7: a worker serving jobs one after another released nothing (decode
//! threads, pre-touched batch buffers, mapped shards), and grew until the OOM killer stopped it
//! (measured before: 240, 400, 551, 700, 848 MiB after 5 small jobs). A real worker process
//! serves 5 consecutive jobs here; its resident memory after each, once the job ended, must
//! come back to what it was after the first.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{path_str, start_node, stoker_command};

/// Resident memory of process `pid`, in MiB (Linux `/proc`).
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status: {status:?}"));
    kib / 1024.0
}

#[test]
fn a_worker_serving_jobs_one_after_another_does_not_grow() {
    let dir = stoker_testkit::unique_temp_dir("stoker-worker-memory").expect("temp dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 4, 16, 64 << 10).expect("dataset");
    let data_dir = dir.join("coordinator");
    let (_coordinator, coordinator) = start_node(&["coordinator", "--listen", "127.0.0.1:0", "--data-dir", path_str(&data_dir)]);
    let added =
        stoker_command().args(["dataset", "add", "train", path_str(&manifest), "--coordinator", &coordinator]).output().expect("add");
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let (worker, _) =
        start_node(&["worker", "--coordinator", &coordinator, "--listen", "127.0.0.2:0", "--threads", "1", "--job-idle-ms", "1000"]);
    let pid = worker.0.id();
    // Batches of 32 crops of 320x320: 9.8 MB each, 4 in flight: ~40 MB of buffers per job.
    let mut after_each = Vec::new();
    for job in 0..5u64 {
        let consumed = stoker_command()
            .args(["consume", "--coordinator", &coordinator, "--dataset", "train", "--batch-size", "32", "--size", "320"])
            .args(["--epochs", "1", "--seed", &job.to_string(), "--rank", "0", "--world-size", "1"])
            .stdout(Stdio::null())
            .output()
            .expect("consume");
        assert!(consumed.status.success(), "job {job}: {}", String::from_utf8_lossy(&consumed.stderr));
        if job == 0 {
            // Once released, the first job's memory is the level the others must come back to.
            let deadline = Instant::now() + Duration::from_secs(15);
            let mut last = rss_mib(pid);
            loop {
                std::thread::park_timeout(Duration::from_millis(500));
                let now = rss_mib(pid);
                if (last - now).abs() < 1.0 || Instant::now() >= deadline {
                    break;
                }
                last = now;
            }
            after_each.push(rss_mib(pid));
            continue;
        }
        // Each later job's pipeline is released once its trainer detached: a bounded wait.
        let baseline = after_each[0];
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut rss = rss_mib(pid);
        while rss > baseline + 16.0 && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(200));
            rss = rss_mib(pid);
        }
        after_each.push(rss);
    }
    eprintln!("worker RSS after each of 5 consecutive jobs, released: {after_each:.0?} MiB");
    let (first, last) = (after_each[0], after_each[4]);
    assert!(last <= first + 16.0, "the worker grew from {first:.0} to {last:.0} MiB over 5 jobs: {after_each:.0?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Anonymous resident memory of process `pid` (heap and buffers, not mapped shard files), in
/// MiB; `None` once the process is gone.
fn anon_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find_map(|line| line.strip_prefix("RssAnon:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Issue 19: a worker never allocates past its batch memory budget. A real worker process,
/// told to keep 8 batches in flight but given room for 2 of these 19.7 MB batches, makes a
/// whole epoch; its anonymous memory, sampled every 20 ms, grows by no more than the budget
/// and a margin for decoding and sending (without the budget it holds 8 batches: 158 MB).
#[test]
fn a_worker_stays_within_its_batch_memory_budget() {
    const BUDGET_MIB: f64 = 45.0;
    const MARGIN_MIB: f64 = 40.0;
    let dir = stoker_testkit::unique_temp_dir("stoker-worker-budget").expect("temp dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 4, 32, 64 << 10).expect("dataset");
    let data_dir = dir.join("coordinator");
    let (_coordinator, coordinator) = start_node(&["coordinator", "--listen", "127.0.0.1:0", "--data-dir", path_str(&data_dir)]);
    let added =
        stoker_command().args(["dataset", "add", "train", path_str(&manifest), "--coordinator", &coordinator]).output().expect("add");
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let budget = format!("{}", (BUDGET_MIB * 1024.0 * 1024.0) as u64);
    let (worker, _) = start_node(&[
        "worker",
        "--coordinator",
        &coordinator,
        "--listen",
        "127.0.0.2:0",
        "--threads",
        "1",
        "--in-flight",
        "8",
        "--max-batch-memory",
        &budget,
    ]);
    let pid = worker.0.id();
    std::thread::sleep(Duration::from_millis(500));
    let idle = anon_mib(pid).expect("the worker runs");
    // Batches of 64 crops of 320x320x3: 19.7 MB each; the budget holds 2.
    let mut consume = stoker_command()
        .args(["consume", "--coordinator", &coordinator, "--dataset", "train", "--batch-size", "64", "--size", "320"])
        .args(["--epochs", "1", "--rank", "0", "--world-size", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("consume");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = idle;
    let status = loop {
        if let Some(status) = consume.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the epoch did not finish in 120 s");
        peak = peak.max(anon_mib(pid).expect("the worker runs"));
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut consume.stderr.take().expect("stderr"), &mut stderr);
    assert!(status.success(), "consume: {stderr}");
    eprintln!("worker anonymous memory: {idle:.0} MiB idle, {peak:.0} MiB at its peak, budget {BUDGET_MIB} MiB + {MARGIN_MIB} MiB margin");
    assert!(peak - idle <= BUDGET_MIB + MARGIN_MIB, "the worker grew by {:.0} MiB, over its {BUDGET_MIB} MiB budget", peak - idle);
    let _ = std::fs::remove_dir_all(&dir);
}
