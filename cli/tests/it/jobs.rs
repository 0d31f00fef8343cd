//! `stoker job ls` and `stoker job rm` against a real coordinator (issue 16, item 7).

use std::process::Stdio;

use crate::support::{path_str, start_node, stoker, text};

#[test]
fn a_finished_job_is_listed_with_its_checkpoint_and_removed_by_name() {
    let dir = stoker_testkit::unique_temp_dir("stoker-cli-jobs").expect("temp dir");
    let manifest = stoker_testkit::sample_dataset(&dir, 2, 8, 64 << 10).expect("dataset");
    let data_dir = dir.join("coordinator");
    let (_coordinator, coordinator) = start_node(&["coordinator", "--listen", "127.0.0.1:0", "--data-dir", path_str(&data_dir)]);
    let empty = stoker(&["job", "ls", "--coordinator", &coordinator]);
    assert!(empty.status.success() && text(&empty).contains("no jobs"), "{}", text(&empty));
    assert!(stoker(&["dataset", "add", "train", path_str(&manifest), "--coordinator", &coordinator]).status.success());
    let (_worker, _) = start_node(&["worker", "--coordinator", &coordinator, "--listen", "127.0.0.2:0", "--threads", "1"]);
    let consumed = crate::support::stoker_command()
        .args(["consume", "--coordinator", &coordinator, "--dataset", "train", "--rank", "0", "--world-size", "1"])
        .args(["--batch-size", "4", "--epochs", "1", "--size", "32", "--shuffle", "full"])
        .stdout(Stdio::null())
        .output()
        .expect("consume");
    assert!(consumed.status.success(), "{}", text(&consumed));
    // The job's checkpoint is what the last progress report the coordinator got says (the
    // trainer's very last report may not go out before it detaches), committed at the
    // coordinator's next checkpoint flush (every second).
    let mut listing = String::new();
    for _ in 0..50 {
        let listed = stoker(&["job", "ls", "--coordinator", &coordinator]);
        listing = text(&listed);
        assert!(listed.status.success(), "{listing}");
        if listing.contains(" position ") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let line = listing.lines().find(|line| line.starts_with("train-")).unwrap_or_else(|| panic!("the job is listed: {listing}"));
    assert!(line.contains(" epoch ") && line.contains(" position "), "a checkpoint: {line}");
    assert!(line.contains("0/1"), "no live trainer once it detached: {line}");
    let name = line.split_whitespace().next().expect("a name").to_owned();
    let removed = stoker(&["job", "rm", &name, "--coordinator", &coordinator]);
    assert!(removed.status.success() && text(&removed).contains("removed job"), "{}", text(&removed));
    assert!(text(&stoker(&["job", "ls", "--coordinator", &coordinator])).contains("no jobs"));
    let again = stoker(&["job", "rm", &name, "--coordinator", &coordinator]);
    assert!(!again.status.success() && text(&again).contains("no job named"), "{}", text(&again));
    let _ = std::fs::remove_dir_all(&dir);
}
