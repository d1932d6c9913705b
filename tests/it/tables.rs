//! Tables as a user manages them across processes: list, check, drop,
//! attach, load only; and a RACE table whose growing load is SIGKILLed,
//! finished by the next process.

use std::time::Instant;

use serde_json::{json, Value};

use crate::cli::{compute, kill_point, record, run_killed, tmp, Blade};
use crate::dtx::run_json;

fn ok_out(args: &[&str]) -> String {
    let out = compute(args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?}: {text}");
    text
}

fn fails(args: &[&str], says: &str) {
    let out = compute(args);
    let err = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
}

#[test]
fn tables_made_by_other_processes_are_listed_checked_attached_and_dropped() {
    let blade = Blade::start(&["--size", "256MiB"]);
    let b = blade.addr.as_str();
    let q = ["--quiet", "--threads", "2", "--coroutines", "4"];
    ok_out(
        &[
            &["ycsb", "--blades", b, "--app", "race", "--table", "t1", "--keys", "4000", "--capacity", "200"][..],
            &q,
            &["--load-only"],
        ]
        .concat(),
    );
    ok_out(
        &[&["ycsb", "--blades", b, "--app", "sherman", "--table", "t2", "--keys", "4000"][..], &q, &["--load-only"]]
            .concat(),
    );
    let list = run_json("list.json", &["table", "list", "--blades", b]);
    let names: Vec<(&str, &str)> = list["indexes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["kind"].as_str().unwrap(), i["name"].as_str().unwrap_or("?")))
        .collect();
    assert!(names.contains(&("race", "t1")) && names.contains(&("sherman", "t2")), "{names:?}");
    let c = run_json("check1.json", &["table", "check", "t1", "--blades", b]);
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(true), Some(4000)), "{c}");
    assert_eq!(
        (c["check"]["split_intent"].as_bool(), c["check"]["resize_lock_held"].as_bool()),
        (Some(false), Some(false))
    );
    let c = run_json("check2.json", &["table", "check", "t2", "--app", "sherman", "--blades", b]);
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(true), Some(4000)), "{c}");
    // Attached as it is: nothing inserted, every key verified.
    let r =
        run_json(
            "attached.json",
            &[
                &[
                    "ycsb",
                    "--blades",
                    b,
                    "--app",
                    "sherman",
                    "--table",
                    "t2",
                    "--keys",
                    "4000",
                    "--no-load",
                    "--verify",
                ][..],
                &q,
                &["--duration", "0.3", "--warmup", "0"],
            ]
            .concat(),
        );
    assert_eq!(
        (r["table_state"].as_str(), r["lost"].as_u64(), r["violations"].as_u64()),
        (Some("attached"), Some(0), Some(0)),
        "{r}"
    );
    let (before, after) =
        (r["blade_heap_bytes_before"].as_u64().unwrap(), r["blade_heap_bytes_after"].as_u64().unwrap());
    assert!(before > 0 && after >= before, "{before} → {after}");
    // Dropped: gone from the list, its name free, attaching to it refused.
    let dropped = ok_out(&["table", "drop", "t1", "--blades", b]);
    assert!(dropped.contains("dropped race index \"t1\"") && dropped.contains(" 4000 KV blocks"), "{dropped}");
    let list = run_json("list2.json", &["table", "list", "--blades", b]);
    assert!(list["indexes"].as_array().unwrap().iter().all(|i| i["name"] != "t1"), "{list}");
    fails(&["table", "check", "t1", "--blades", b], "does not exist");
    fails(&["table", "drop", "t1", "--blades", b], "no race index");
    fails(&[&["ycsb", "--blades", b, "--table", "t1", "--keys", "10", "--no-load"][..], &q].concat(), "does not exist");
    // The name can be used again: a fresh table.
    let r = run_json(
        "again.json",
        &[
            &["ycsb", "--blades", b, "--app", "race", "--table", "t1", "--keys", "1000", "--verify"][..],
            &q,
            &["--duration", "0.2", "--warmup", "0"],
        ]
        .concat(),
    );
    assert_eq!((r["table_state"].as_str(), r["violations"].as_u64()), (Some("created"), Some(0)));
    fails(&["table", "list", "extra", "--blades", b], "takes no NAME");
    fails(&["table", "check", "--blades", b], "need the index's NAME");
    fails(&["table", "repair", "t2", "--app", "sherman", "--blades", b], "table repair is for RACE tables");
    // A B+tree dropped gives its pages back.
    let dropped = ok_out(&["table", "drop", "t2", "--app", "sherman", "--blades", b]);
    assert!(
        dropped.contains("dropped sherman index \"t2\"") && dropped.contains(" pages and 0 value blocks"),
        "{dropped}"
    );
    fails(&["table", "check", "t2", "--app", "sherman", "--blades", b], "no sherman index");
}

/// Whether a check of table "grow" shows a split left unfinished: a
/// publication intent, the directory lock held, or frozen slots in a live
/// subtable. (A split lock held over a subtable with no frozen slot is
/// not: that subtable works as before, and its next grower takes the lock
/// over after the lease; `split_locks_held` counts them.)
fn unfinished(c: &Value) -> bool {
    split_cut(&c["check"]) || c["check"]["resize_lock_held"] == true
}

/// Whether a check (its `check` object) shows a split cut short: frozen
/// slots in a live subtable, or a publication intent.
fn split_cut(k: &Value) -> bool {
    k["frozen_slots"].as_u64().unwrap_or(0) > 0 || k["split_intent"] == true
}

#[test]
fn a_growing_race_load_killed_at_random_points_is_finished_by_the_next_process() {
    const TABLES: [&str; 5] = ["grow0", "grow1", "grow2", "grow3", "grow4"];
    let blade = Blade::start(&["--size", "512MiB"]);
    let b = blade.addr.as_str();
    let (mut killed, mut left_unfinished) = (0, 0);
    for (i, table) in TABLES.into_iter().enumerate() {
        // Killed early in a load that splits all the time.
        let ms = kill_point(i as u64, 60, 250);
        let load = [
            &["ycsb", "--blades", b, "--app", "race", "--table", table, "--keys", "40000", "--capacity", "100"][..],
            &["--load-only", "--threads", "2", "--coroutines", "8", "--quiet"],
        ]
        .concat();
        if run_killed(&load, ms) {
            killed += 1;
        } else {
            eprintln!("{table}: the load finished before its kill at {ms} ms");
        }
        // A check reads the table as the dead process left it (never waits;
        // it exits 1 when it finds a fault).
        let j = tmp("grow-check.json");
        let _ = std::fs::remove_file(&j);
        let out = compute(&["table", "check", table, "--blades", b, "--json", j.to_str().unwrap()]);
        let before = if j.exists() {
            let c = record(&j);
            std::fs::remove_file(&j).unwrap();
            assert_eq!(out.status.success(), c["ok"] == true, "{c}");
            c["check"].clone()
        } else {
            // Killed before the table existed (its name is set last).
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(!out.status.success() && said.contains("does not exist"), "{said}");
            Value::Null
        };
        let cut = unfinished(&json!({ "check": before }));
        left_unfinished += u32::from(cut);
        eprintln!("{table}: killed after {ms} ms: {before}");
        // The last two tables are repaired first (`table repair`): it
        // waits out the lease, takes every lock the dead process left over
        // and finishes its splits, leaving nothing to the next run.
        let repaired = i >= 3 && !before.is_null();
        if repaired {
            let rp = run_json("grow-repair.json", &["table", "repair", table, "--blades", b]);
            assert_eq!(rp["ok"], true, "{rp}");
            assert!(!unfinished(&rp) && rp["check"]["split_locks_held"] == 0, "{rp}");
            let (takeovers, finished) = (rp["takeovers"].as_u64().unwrap(), rp["finished_splits"].as_u64().unwrap());
            if split_cut(&before) {
                assert!(finished >= 1, "{rp}");
            }
            let held = before["split_locks_held"].as_u64().unwrap() + u64::from(before["resize_lock_held"] == true);
            assert!(takeovers >= held, "{before} → {rp}");
            eprintln!("{table}: repaired: {takeovers} lock(s) taken over, {finished} split(s) finished");
        }
        // The next process loads what is missing (meeting the frozen
        // subtable, taking the dead holder's lock over after its lease and
        // finishing its split), then reads every key back: every key once.
        let t0 = Instant::now();
        let args = ["ycsb", "--blades", b, "--app", "race", "--table", table, "--keys", "40000", "--workload", "c"];
        let run = ["--verify", "--threads", "2", "--coroutines", "8", "--duration", "0.3", "--warmup", "0", "--quiet"];
        let r = run_json("grow-final.json", &[&args[..], &run[..]].concat());
        assert_eq!(
            (r["violations"].as_u64(), r["duplicates"].as_u64(), r["lost"].as_u64()),
            (Some(0), Some(0), Some(0)),
            "{r}"
        );
        let c = run_json("grow-after.json", &["table", "check", table, "--blades", b]);
        assert_eq!(c["ok"], true, "{c}");
        assert!(!unfinished(&c), "{c}");
        let (takeovers, finished) =
            (r["race"]["takeovers"].as_u64().unwrap(), r["race"]["recovered_splits"].as_u64().unwrap());
        // What the dead process left, this one finished (the check after
        // the run found no intent, no directory lock, no frozen slot): a
        // subtable it had begun to freeze (or was publishing) was met by
        // the verifying reads, its split lock (and the directory lock, if
        // held) taken over and its split finished.
        if !repaired && split_cut(&before) {
            assert!(takeovers >= 1 && finished >= 1, "{r}");
        }
        if !repaired && before["resize_lock_held"] == true {
            assert!(takeovers >= 1, "{r}");
        }
        eprintln!(
            "{table}: the next process took {takeovers} lock(s) over, finished {finished} split(s), in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!("{killed} kills, {left_unfinished} left a split unfinished");
}

/// Blade heap in use after a run, from its record.
fn heap_after(r: &Value) -> u64 {
    r["blade_heap_bytes_after"].as_u64().unwrap()
}

#[test]
fn a_hundred_short_update_runs_and_a_long_one_leave_blade_memory_bounded() {
    let blade = Blade::start(&["--size", "256MiB"]);
    let b = blade.addr.as_str();
    let table = ["ycsb", "--blades", b, "--app", "race", "--table", "churn", "--keys", "20000"];
    let q = ["--quiet", "--threads", "2", "--coroutines", "4", "--warmup", "0"];
    run_json("churn-load.json", &[&table[..], &q, &["--load-only"]].concat());
    let update = [&table[..], &q, &["--no-load", "--workload", "update-only"]].concat();
    let mut heap = Vec::new();
    let mut updated = 0;
    for i in 0..100 {
        let r = run_json("churn.json", &[&update[..], &["--duration", "0.1"]].concat());
        assert_eq!((r["errors"].as_u64(), r["table_state"].as_str()), (Some(0), Some("attached")), "run {i}: {r}");
        let reclaim = &r["race"]["reclaim"];
        assert!(reclaim["retired_bytes"].as_u64() > Some(0), "run {i}: {reclaim}");
        updated += r["ops"].as_u64().unwrap();
        heap.push(heap_after(&r));
    }
    // Every run replaced blocks (retired them); after the first few runs,
    // which fill the free lists, the heap stays put.
    let grew = heap[99] - heap[9];
    eprintln!(
        "100 runs, {updated} updates: heap {} MiB after run 10, {} MiB after run 100",
        heap[9] >> 20,
        heap[99] >> 20
    );
    assert!(grew <= 4 << 20, "the heap grew by {grew} bytes over runs 10..100: {heap:?}");
    // A long run: the heap grows by at most a few spans, not by its updates.
    let r = run_json("churn-long.json", &[&update[..], &["--duration", "3", "--verify"]].concat());
    let (before, after) = (r["blade_heap_bytes_before"].as_u64().unwrap(), heap_after(&r));
    let replaced = r["race"]["reclaim"]["retired_bytes"].as_u64().unwrap();
    eprintln!("3 s run: {} updates, {replaced} bytes retired, heap {before} → {after}", r["ops"]);
    // (How much it replaces depends on the machine's load; at least 1 MiB.)
    assert!(after - before <= 4 << 20 && replaced > 1 << 20, "{r}");
    assert_eq!((r["lost"].as_u64(), r["violations"].as_u64()), (Some(0), Some(0)), "{r}");
    let c = run_json("churn-check.json", &["table", "check", "churn", "--blades", b]);
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(true), Some(20000)), "{c}");
}

#[test]
fn update_runs_killed_at_random_points_lose_no_key_and_hold_memory_back_only_for_the_lease() {
    let blade = Blade::start(&["--size", "256MiB"]);
    let b = blade.addr.as_str();
    let table = ["ycsb", "--blades", b, "--app", "race", "--table", "killed", "--keys", "20000"];
    let q = ["--quiet", "--threads", "2", "--coroutines", "4", "--warmup", "0"];
    let start = heap_after(&run_json("killed-load.json", &[&table[..], &q, &["--load-only"]].concat()));
    let update = [&table[..], &q, &["--no-load", "--workload", "update-only"]].concat();
    for i in 0..5u64 {
        // Killed anywhere in an update-only run: mid-operation, mid-refresh,
        // between pushing a bag and linking it, after popping one.
        let ms = kill_point(i, 150, 400);
        assert!(run_killed(&[&update[..], &["--duration", "5"]].concat(), ms), "the run ended before it was killed");
    }
    let killed = run_json("killed-check.json", &["table", "check", "killed", "--blades", b]);
    assert_eq!(killed["ok"], true, "{killed}");
    // The next run takes the dead clients' registry entries as dead after
    // the lease (3 s), and reuse resumes; the one after grows nothing.
    let a = run_json("killed-a.json", &[&update[..], &["--duration", "4"]].concat());
    assert!(a["race"]["reclaim"]["expired"].as_u64() >= Some(1), "{}", a["race"]);
    let b2 = run_json("killed-b.json", &[&update[..], &["--duration", "1", "--verify"]].concat());
    let (before, after) = (b2["blade_heap_bytes_before"].as_u64().unwrap(), heap_after(&b2));
    let after_kills = killed["heap_used_per_blade"][0].as_u64().unwrap() + smart_core::layout::HEAP_START;
    eprintln!(
        "5 kills: heap {} MiB after the load, {} MiB after the kills, {} MiB after the run that expired \
         them, {} MiB after the next",
        start >> 20,
        after_kills >> 20,
        before >> 20,
        after >> 20
    );
    assert_eq!((b2["lost"].as_u64(), b2["violations"].as_u64()), (Some(0), Some(0)), "{b2}");
    assert!(after - before <= 2 << 20, "{b2}");
    let c = run_json("killed-after.json", &["table", "check", "killed", "--blades", b]);
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(true), Some(20000)), "{c}");
}

/// Two processes load one growing table at the same time: their splits
/// (of different subtables, in parallel, published one at a time under
/// the directory lock) interleave across processes; an attached verify
/// then finds every key once, and a check finds the table sound.
#[test]
fn two_processes_growing_one_table_at_once_leave_it_whole() {
    let blade = Blade::start(&["--size", "512MiB"]);
    let b = blade.addr.as_str();
    let jsons = [tmp("together0.json"), tmp("together1.json")];
    let mut loads: Vec<_> = jsons
        .iter()
        .map(|j| {
            crate::cli::spawn_compute(&[
                "ycsb",
                "--blades",
                b,
                "--app",
                "race",
                "--table",
                "together",
                "--keys",
                "100000",
                "--capacity",
                "100",
                "--load-only",
                "--threads",
                "1",
                "--coroutines",
                "16",
                "--quiet",
                "--json",
                j.to_str().unwrap(),
            ])
        })
        .collect();
    for l in &mut loads {
        let status = crate::cli::wait_bounded(l, std::time::Duration::from_secs(120), "a load did not finish in 120 s");
        assert!(status.success(), "{status}");
    }
    let splits: Vec<u64> = jsons
        .iter()
        .map(|j| {
            let r = record(j);
            std::fs::remove_file(j).unwrap();
            assert_eq!(
                (r["race"]["takeovers"].as_u64(), r["race"]["lease_losses"].as_u64()),
                (Some(0), Some(0)),
                "{r}"
            );
            r["race"]["splits_by_run"].as_u64().unwrap()
        })
        .collect();
    let args = ["ycsb", "--blades", b, "--app", "race", "--table", "together", "--keys", "100000", "--no-load"];
    let run = ["--verify", "--workload", "c", "--duration", "0.3", "--warmup", "0", "--quiet"];
    let r = run_json("together-verify.json", &[&args[..], &run[..]].concat());
    assert_eq!(
        (r["violations"].as_u64(), r["duplicates"].as_u64(), r["lost"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{r}"
    );
    // Every split was done by one of the two, once.
    assert_eq!(splits.iter().sum::<u64>(), r["race"]["splits"].as_u64().unwrap(), "{splits:?}: {r}");
    let c = run_json("together-check.json", &["table", "check", "together", "--blades", b]);
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(true), Some(100_000)), "{c}");
    assert!(!unfinished(&c) && c["check"]["split_locks_held"] == 0, "{c}");
    eprintln!("splits by each process: {splits:?}");
}

/// RACE tables of the two formats before this one (their header magics)
/// are listed as such, and checking or attaching it fails with a
/// message instead of reading it as the new layout.
#[test]
fn a_table_of_the_older_format_is_named_and_refused() {
    use smart_core::{Runtime, RuntimeConfig, TcpTransport};
    let blade = Blade::start(&["--size", "64MiB"]);
    let b = blade.addr.as_str();
    {
        let t = TcpTransport::connect(std::slice::from_ref(&blade.addr)).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            for (name, magic) in [("old", race_ht::layout::OLD_MAGIC), ("older", race_ht::layout::OLDER_MAGIC)] {
                let head = ctx.alloc(0, 64, 64).await.unwrap();
                let mut img = [0u8; 64];
                img[..8].copy_from_slice(&magic.to_le_bytes());
                ctx.write(head, &img).await.unwrap();
                ctx.set_root(0, &format!("race-ht:{name}"), head).await.unwrap();
            }
        });
    }
    let list = run_json("old-list.json", &["table", "list", "--blades", b]);
    let old: Vec<&Value> = list["indexes"].as_array().unwrap().iter().filter(|i| i["kind"] == "race").collect();
    assert_eq!(old.len(), 2, "{list}");
    for magic in ["RACEDIR3", "RACEDIR2"] {
        let said = |i: &&Value| i["detail"].as_str().is_some_and(|d| d.contains("older format") && d.contains(magic));
        assert!(old.iter().any(said), "{magic}: {list}");
    }
    for name in ["old", "older"] {
        fails(&["table", "check", name, "--blades", b], "older race-ht format");
        fails(
            &["ycsb", "--blades", b, "--table", name, "--keys", "10", "--no-load", "--quiet"],
            "older race-ht format",
        );
    }
}

#[test]
fn a_damaged_free_list_is_named_by_the_check_which_still_checks_the_table() {
    use smart_core::reclaim::{ENTRY, FREE_ROOT};
    use smart_core::{Runtime, RuntimeConfig, TcpTransport};
    let blade = Blade::start(&["--size", "64MiB"]);
    let b = blade.addr.as_str();
    let table = ["ycsb", "--blades", b, "--app", "race", "--table", "dmg", "--keys", "2000", "--quiet"];
    run_json("dmg-load.json", &[&table[..], &["--load-only"]].concat());
    // Updates replace blocks: the run's end hands them to the free lists.
    let r = run_json(
        "dmg-upd.json",
        &[&table[..], &["--no-load", "--workload", "update-only", "--duration", "0.3"]].concat(),
    );
    assert!(r["race"]["reclaim"]["retired_bytes"].as_u64() > Some(0), "{r}");
    // A stray writer: one list's head now names a bag past the blade's end.
    let listed = {
        let t = TcpTransport::connect(std::slice::from_ref(&blade.addr)).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let area = ctx.root(0, FREE_ROOT).await.unwrap().expect("free lists");
            for class in 0..128u64 {
                let head = area.add(ENTRY * class + 8);
                if ctx.read_u64(head).await.unwrap() & ((1 << 40) - 1) != 0 {
                    ctx.write(head, &(65u64 << 20).to_le_bytes()).await.unwrap();
                    return class;
                }
            }
            panic!("no free list holds a bag");
        })
    };
    let j = tmp("dmg-check.json");
    let out = compute(&["table", "check", "dmg", "--blades", b, "--json", j.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let says = format!("free lists: memory blade 0 is damaged: free list {listed} names a bag at offset 0x4100000");
    assert!(text.contains(&says), "{text}");
    assert!(text.contains("race \"dmg\": 2000 keys"), "the table is still checked: {text}");
    let c = record(&j);
    std::fs::remove_file(&j).unwrap();
    assert_eq!((c["ok"].as_bool(), c["check"]["keys"].as_u64()), (Some(false), Some(2000)), "{c}");
    assert_eq!(c["free_list_damage"].as_array().map(Vec::len), Some(1), "{c}");
}

/// A load the blade cannot hold is refused before anything is allocated,
/// saying what it needs and what is free; a table that filled half the
/// blade (its load killed half-way, then completed) drops, and a second
/// one as large, which the rest of the heap could not hold, is made of its
/// memory and verifies. (A drop on a blade whose heap is exhausted:
/// `reclaim::a_full_blade_s_…` in smart-core's tests.)
#[test]
fn a_load_that_cannot_fit_is_refused_and_a_dropped_table_s_memory_is_reused() {
    let blade = Blade::start(&["--size", "32MiB"]);
    let b = blade.addr.as_str();
    fails(&["ycsb", "--blades", b, "--keys", "50000000"], "needs at least");
    fails(&["ycsb", "--blades", b, "--keys", "50000000"], "MiB free (blade 0:");
    assert!(ok_out(&["table", "list", "--blades", b]).contains("no index"));
    let q = ["--quiet", "--threads", "2", "--coroutines", "4", "--duration", "0.2", "--warmup", "0"];
    // About 16.5 MB each: two do not fit in 32 MiB side by side.
    let load = ["ycsb", "--blades", b, "--keys", "200000", "--table", "big"];
    // Killed at a random point (its load half-way, or its run), then
    // completed by the next process, which runs for longer than the
    // reclamation lease (3 s): it sees the killed client's epoch entries
    // dead and frees them, so that they no longer hold reuse back.
    run_killed(&[&load[..], &q[..]].concat(), kill_point(7, 100, 400));
    // (Read-only: on a blade this full, updates' out-of-place writes would
    // need the retired blocks that the dead entries hold back.)
    ok_out(&[&load[..], &q[..5], &["--workload", "c", "--duration", "3.5", "--warmup", "0"]].concat());
    let said = ok_out(&["table", "drop", "big", "--blades", b]);
    assert!(said.contains("retired for reuse"), "{said}");
    let again = ["ycsb", "--blades", b, "--keys", "200000", "--table", "again", "--verify", "--workload", "c"];
    let r = run_json("reused.json", &[&again[..], &q[..]].concat());
    assert_eq!(r["violations"], 0, "{r}");
    let reused = r["race"]["reclaim"]["reused_bytes"].as_u64().unwrap();
    assert!(reused > 4 << 20, "{reused} bytes reused: {r}");
}
