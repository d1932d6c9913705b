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
