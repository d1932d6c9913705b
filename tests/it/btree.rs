//! The B+tree as a user runs it: compute blades SIGKILLed while they load
//! and update a tree on a memory-blade process, then a verified run on the
//! same tree.

use crate::cli::{kill_point, run_killed, Blade};
use crate::dtx::run_json;

#[test]
fn b_tree_clients_killed_mid_load_and_mid_run_leave_a_tree_the_next_run_verifies() {
    let blade = Blade::start(&["--size", "512MiB"]);
    // Kill points spread over the load (splits, root growth) and the run
    // (updates, inserts, scans), from the process id so that reruns vary.
    for i in 0..6u64 {
        let ms = kill_point(i, 150, 1500);
        let workload = ["a", "e", "d"][i as usize % 3];
        let args = [
            &["ycsb", "--app", "sherman", "--blades", &blade.addr, "--table", "killed", "--keys", "60000"][..],
            &["--workload", workload, "--threads", "2", "--coroutines", "8", "--duration", "60", "--warmup", "0"],
            &["--quiet"],
        ]
        .concat();
        assert!(run_killed(&args, ms), "the run ended before it was killed");
        eprintln!("killed {workload} run {i} after {ms} ms");
    }
    // A verified run on the same tree: the load completes what the killed
    // loads left (inserting only missing keys), any lock a dead client held
    // is taken over after its lease, every loaded key reads back its own
    // value, no key is stored twice, and the structural walk passes.
    let args = ["ycsb", "--app", "sherman", "--blades", &blade.addr, "--table", "killed", "--keys", "60000"];
    let run =
        ["--workload", "e", "--verify", "--threads", "2", "--coroutines", "4", "--duration", "1", "--warmup", "0"];
    let r = run_json("killed-btree.json", &[&args[..], &run[..], &["--quiet"]].concat());
    assert_eq!((r["violations"].as_u64(), r["duplicates"].as_u64()), (Some(0), Some(0)), "{r}");
    assert_eq!(r["table_existed"], true);
    let bt = &r["sherman"];
    assert!(bt["keys"].as_u64().unwrap() >= 60_000, "{bt}");
    eprintln!(
        "after 6 kills: {} unlinked pages, {} locks taken over, depth {}",
        bt["unlinked"], bt["lock_steals"], bt["depth"]
    );
}

/// Clients killed (SIGKILL) while workload churn deletes keys and merges
/// and frees the pages it empties: a merge cut anywhere leaves its pages
/// marked, and the next writer to lock one finishes it (after the dead
/// client's lock lease); a page merged away whose separator is still in
/// its parent is passed through. A verified churn on the same tree
/// afterwards finds every key it kept and none it deleted, and the
/// structural walk passes.
#[test]
fn b_tree_clients_killed_mid_merge_leave_a_tree_the_next_run_verifies() {
    let blade = Blade::start(&["--size", "512MiB"]);
    let base = ["ycsb", "--app", "sherman", "--blades", &blade.addr, "--table", "merged", "--keys", "40000"];
    let load = ["--load-only", "--threads", "2", "--coroutines", "8", "--quiet"];
    let r = run_json("merged-load.json", &[&base[..], &load[..]].concat());
    assert_eq!(r["violations"].as_u64(), Some(0), "{r}");
    for i in 0..6u64 {
        let ms = kill_point(i, 200, 1500);
        let run = ["--workload", "churn", "--no-load", "--threads", "2", "--coroutines", "8", "--duration", "60"];
        let args = [&base[..], &run[..], &["--warmup", "0", "--quiet"]].concat();
        assert!(run_killed(&args, ms), "the run ended before it was killed");
        eprintln!("killed churn run {i} after {ms} ms");
    }
    let run = ["--workload", "churn", "--verify", "--threads", "2", "--coroutines", "4", "--duration", "1"];
    let r = run_json("merged.json", &[&base[..], &run[..], &["--warmup", "0", "--quiet"]].concat());
    assert_eq!(
        (r["violations"].as_u64(), r["duplicates"].as_u64(), r["resurrected"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{r}"
    );
    let bt = &r["sherman"];
    assert!(bt["merges"].as_u64().unwrap() > 0, "{bt}");
    eprintln!(
        "after 6 kills mid-churn: {} merges helped, {} locks taken over, {} pages in a merge and {} dead pages still \
         named at the end, depth {}",
        bt["merges_helped"], bt["lock_steals"], bt["merging"], bt["dead_named"], bt["depth"]
    );
}
