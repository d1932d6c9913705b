//! A lost memory blade (SIGKILLed, without a backing file) rebuilt from the
//! other replicas onto a fresh one: `compute-blade rebuild`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cli::{compute, wait_bounded, Blade, COMPUTE};
use crate::dtx::run_json;

/// Three anonymous memory blades and their `--blades` list.
fn three() -> (Vec<Blade>, Vec<String>) {
    let b: Vec<Blade> = (0..3).map(|_| Blade::start(&["--size", "64MiB"])).collect();
    let addrs = b.iter().map(|b| b.addr.clone()).collect();
    (b, addrs)
}

/// A short audited SmallBank run of 2 000 accounts on `list`: its record.
fn smallbank(list: &str, name: &str) -> Value {
    let q = ["--blades", list, "--duration", "0.3", "--warmup", "0", "--quiet"];
    run_json(name, &[&SMALLBANK[..], &q[..]].concat())
}

/// SIGKILLs blade `i` (its memory goes with it) and starts a fresh one in
/// its place: the new `--blades` list.
fn lose(blades: &mut Vec<Blade>, addrs: &mut [String], i: usize) -> String {
    drop(blades.remove(i));
    let fresh = Blade::start(&["--size", "64MiB"]);
    addrs[i] = fresh.addr.clone();
    blades.insert(i, fresh);
    addrs.join(",")
}

/// `--audit-only` of `workload` on `list`: its exit status and record.
fn audit(workload: &str, list: &str, name: &str) -> (Option<i32>, Value) {
    let j = crate::cli::tmp(name);
    let out = Command::new(COMPUTE)
        .args([workload, "--blades", list, "--audit-only", "--quiet", "--json", j.to_str().unwrap()])
        .output()
        .unwrap();
    let r = if j.exists() { crate::cli::record(&j) } else { Value::Null };
    let _ = std::fs::remove_file(&j);
    (out.status.code(), r)
}

/// Audits SmallBank on `list` (its record named `name`): clean and the
/// money conserved. Returns the record.
fn smallbank_money_kept(list: &str, name: &str) -> Value {
    let (code, r) = audit("smallbank", list, name);
    assert_eq!(code, Some(0), "money conserved, no lock held, replicas equal: {r}");
    assert_eq!(r["audit"]["balances"], r["audit"]["expected"], "{r}");
    r
}

/// [`smallbank_money_kept`], with as many live rows as the run `before`
/// left.
fn smallbank_all_back(list: &str, before: &Value, name: &str) {
    let r = smallbank_money_kept(list, name);
    assert_eq!(r["audit"]["db"]["live"], before["audit"]["db"]["live"], "every row is back");
}

/// A rebuild's output says it rolled the dead compute blade's transactions
/// back from its undo log, none left unsettled.
fn settled_from_the_log(text: &str) {
    assert!(text.contains("rolled back") && !text.contains("cannot be rolled back"), "{text}");
}

/// Runs `compute-blade rebuild` until no live lease holds it back (at most
/// 30 s): its exit status and output.
fn rebuild(list: &str, lost: &str) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        let out = compute(&["rebuild", "--blades", list, "--lost", lost]);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        if !text.contains("holds a lease") || start.elapsed() > Duration::from_secs(30) {
            return (out.status.code(), text);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// What a rebuild of blade `i` does before it writes anything, and no
/// more (it dies there): its mark on blade 0, and the fresh blade adopted.
fn adopt_and_stop(addrs: &[String], i: u16) {
    use smart_core::{GlobalAddr, Runtime, RuntimeConfig, TcpTransport};
    let t = TcpTransport::connect(addrs).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let guard = GlobalAddr::new(i, smart_core::layout::HEAP_START);
        ctx.set_root(0, ford_dtx::db::REBUILDING, guard).await.unwrap();
        ctx.adopt_blade(i).await.unwrap();
    });
}

/// The SmallBank database of [`smallbank`].
const SMALLBANK: [&str; 6] = ["smallbank", "--accounts", "2000", "--hot", "50", "--audit"];

/// An audited SmallBank compute blade of 2 threads with a 1 s lease on
/// `list` (and `extra` arguments), 1.5 s into its run.
fn running_smallbank(list: &str, extra: &[&str]) -> std::process::Child {
    let run = Command::new(COMPUTE)
        .args(SMALLBANK)
        .args(extra)
        .args(["--blades", list, "--threads", "2", "--duration", "20", "--warmup", "0", "--lease", "1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    run
}

#[test]
fn a_lost_memory_blade_is_rebuilt_from_the_other_replicas() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--audit"];
    let sb = smallbank(&list, "rb-sb.json");
    let ta = run_json("rb-tatp.json", &[&["tatp", "--subscribers", "2000"], &q[..]].concat());
    assert_eq!((sb["violations"].as_u64(), ta["violations"].as_u64()), (Some(0), Some(0)));
    // Blade 1 dies with its memory; a fresh one takes its place.
    let list = lose(&mut blades, &mut addrs, 1);
    let (code, _) = audit("smallbank", &list, "rb-refused.json");
    assert_ne!(code, Some(0), "a replaced blade is refused until rebuilt");
    // Blade 0 lives: blade 1, fresh, keeps no mirror, and says so.
    let out = compute(&["rebuild", "--blades", &list, "--lost", "0"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("memory blade 1 keeps no database mirror, but memory blade 2 does: memory blade 1 was lost too"),
        "{out:?}"
    );
    let (code, text) = rebuild(&list, "1");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("smallbank: rebuilt on memory blade 1: 2 bucket arrays"), "{text}");
    for (w, before) in [("smallbank", &sb), ("tatp", &ta)] {
        let (code, r) = audit(w, &list, "rb-audit.json");
        assert_eq!(code, Some(0), "{w}: {r}");
        assert_eq!(r["audit"]["db"]["live"], before["audit"]["db"]["live"], "{w}: every row is back");
    }
    // A blade that is not fresh (something allocated on it) is not taken
    // for a lost one.
    let used = Blade::start(&["--size", "64MiB"]);
    let m = compute(&[
        "micro",
        "--blades",
        &used.addr,
        "--op",
        "read",
        "--size",
        "8",
        "--duration",
        "0.1",
        "--warmup",
        "0",
    ]);
    assert!(m.status.success(), "{m:?}");
    let other = [addrs[0].as_str(), used.addr.as_str(), addrs[2].as_str()].join(",");
    let (code, text) = rebuild(&other, "1");
    assert!(code == Some(1) && text.contains("is not a fresh memory blade"), "{text}");
    // The mirrors were on blade 1: its rebuild wrote them again, so blade 0
    // can be lost next and come back.
    let list = lose(&mut blades, &mut addrs, 0);
    let (code, text) = rebuild(&list, "0");
    assert_eq!(code, Some(0), "{text}");
    for (w, before) in [("smallbank", &sb), ("tatp", &ta)] {
        let (code, r) = audit(w, &list, "rb-audit0.json");
        assert_eq!(code, Some(0), "{w}: {r}");
        assert_eq!(r["audit"]["db"]["live"], before["audit"]["db"]["live"], "{w}: every row is back");
    }
    // The rebuilt blades serve transactions.
    let again = smallbank(&list, "rb-again.json");
    assert_eq!(again["violations"].as_u64(), Some(0), "{again}");
}

#[test]
fn a_memory_blade_lost_under_running_transactions_is_rebuilt_and_the_money_kept() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    assert_eq!(smallbank(&list, "rbl-load.json")["violations"], 0);
    // Blade 2 (the ledger's primary, a backup of the checking accounts)
    // dies under a run of 2 threads with a 1 s lease.
    let mut run = running_smallbank(&list, &[]);
    drop(blades.remove(2));
    let st = wait_bounded(&mut run, Duration::from_secs(60), "the run whose memory blade died");
    assert_eq!(st.code(), Some(1), "the run fails: its memory blade is unreachable");
    let fresh = Blade::start(&["--size", "64MiB"]);
    addrs[2] = fresh.addr.clone();
    blades.push(fresh);
    let list = addrs.join(",");
    // Refused while the dead compute blade's lease runs; then rebuilt, and
    // its transactions settled from what survives.
    let (code, text) = rebuild(&list, "2");
    assert_eq!(code, Some(0), "{text}");
    settled_from_the_log(&text);
    eprintln!("{text}");
    smallbank_money_kept(&list, "rbl-audit.json");
}

#[test]
fn a_rebuild_that_stopped_after_adopting_the_blade_refuses_other_commands_and_resumes() {
    let (_blades, list) = stopped_rebuild_resumes(1, "rbr");
    // A set whose blades were all kept: nothing to rebuild.
    let (code, text) = rebuild(&list, "2");
    assert!(code == Some(1) && text.contains("it was not lost"), "{text}");
}

/// Blade 0 held every database's catalog, registry and named roots besides
/// its copies of the tables: lost under a running SmallBank compute blade,
/// it comes back from the databases' mirrors on blade 1 and the other
/// replicas, and the dead compute blade's transactions are settled.
#[test]
fn a_lost_blade_0_is_rebuilt_from_the_mirrors_and_the_other_replicas() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    assert_eq!(smallbank(&list, "rb0-load.json")["violations"], 0);
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--audit"];
    let ta = run_json("rb0-tatp.json", &[&["tatp", "--subscribers", "2000"][..], &q].concat());
    assert_eq!(ta["violations"], 0, "{ta}");
    let mut run = running_smallbank(&list, &[]);
    let list = lose(&mut blades, &mut addrs, 0);
    let st = wait_bounded(&mut run, Duration::from_secs(60), "the run whose blade 0 died");
    assert_eq!(st.code(), Some(1), "the run fails: its memory blade is unreachable");
    let (code, _) = audit("smallbank", &list, "rb0-refused.json");
    assert_eq!(code, Some(1), "a replaced blade 0 is refused until rebuilt");
    let (code, text) = rebuild(&list, "0");
    assert_eq!(code, Some(0), "{text}");
    // It waits for the dead compute blade's lease (1 s and the grace), then
    // settles its transactions from its undo log (on blade 1).
    assert!(text.contains("waiting 3.0 s: 1 compute blades were registered"), "{text}");
    assert!(text.contains("smallbank: rebuilt on memory blade 0: 2 bucket arrays"), "{text}");
    assert!(text.contains("tatp: rebuilt on memory blade 0: 3 bucket arrays"), "{text}");
    settled_from_the_log(&text);
    smallbank_money_kept(&list, "rb0-audit.json");
    let (code, r) = audit("tatp", &list, "rb0-tatp-audit.json");
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["audit"]["db"]["live"], ta["audit"]["db"]["live"], "every TATP row is back");
    // Both loads completed before: the rebuilt blade 0 says so (no reload).
    let t = compute(&["table", "list", "--blades", &list]);
    let tables = String::from_utf8_lossy(&t.stdout);
    assert_eq!(tables.matches(", loaded").count(), 2, "{tables}");
    // The rebuilt blade serves transactions; and it was not lost.
    let again = smallbank(&list, "rb0-again.json");
    assert_eq!(again["violations"].as_u64(), Some(0), "{again}");
    let (code, text) = rebuild(&list, "0");
    assert!(code == Some(1) && text.contains("it was not lost"), "{text}");
}

/// Blades 0 and 2 lost together under a running SmallBank compute blade
/// (three replicas): the rebuild reads the mirrors on blade 1, waits for
/// the dead compute blade's lease, and settles its transactions from its
/// undo log (on blade 1); the money is conserved.
#[test]
fn blades_0_and_2_lost_under_running_transactions_are_rebuilt_and_the_money_kept() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--replicas", "3"];
    assert_eq!(run_json("rb02-load.json", &[&SMALLBANK[..], &q[..]].concat())["violations"], 0);
    let mut run = running_smallbank(&list, &["--replicas", "3"]);
    lose(&mut blades, &mut addrs, 0);
    let list = lose(&mut blades, &mut addrs, 2);
    let st = wait_bounded(&mut run, Duration::from_secs(60), "the run whose blades 0 and 2 died");
    assert_eq!(st.code(), Some(1), "the run fails: its memory blades are unreachable");
    let (code, text) = rebuild(&list, "0,2");
    assert_eq!(code, Some(0), "{text}");
    eprintln!("{text}");
    assert!(text.contains("waiting 3.0 s: 1 compute blades were registered"), "{text}");
    assert!(text.contains("smallbank: rebuilt on memory blades 0,2: 6 bucket arrays"), "{text}");
    settled_from_the_log(&text);
    smallbank_money_kept(&list, "rb02-audit.json");
}

/// A rebuild of blade 0 that stopped right after adopting the fresh blade
/// (its mark set, nothing restored): other commands refuse the databases,
/// and the rebuild run again finishes it.
#[test]
fn a_rebuild_of_blade_0_that_stopped_after_adopting_it_resumes() {
    stopped_rebuild_resumes(0, "rb0r");
}

/// Three blades with SmallBank; blade `lost` is lost and a rebuild of it
/// stops right after adopting the fresh blade: the audit and other commands
/// refuse the database, and the rebuild run again finishes it, with every
/// row back. Returns the blades and their list.
fn stopped_rebuild_resumes(lost: u16, prefix: &str) -> (Vec<Blade>, String) {
    let (mut blades, mut addrs) = three();
    let sb = smallbank(&addrs.join(","), &format!("{prefix}-sb.json"));
    let list = lose(&mut blades, &mut addrs, lost as usize);
    adopt_and_stop(&addrs, lost);
    let (code, _) = audit("smallbank", &list, &format!("{prefix}-refused.json"));
    assert_eq!(code, Some(1));
    let out = compute(&["smallbank", "--blades", &list, "--audit-only"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("memory blade {lost} is being rebuilt")), "{out:?}");
    let (code, text) = rebuild(&list, &lost.to_string());
    assert_eq!(code, Some(0), "{text}");
    smallbank_all_back(&list, &sb, &format!("{prefix}-audit.json"));
    (blades, list)
}

/// Two blades lost at once, with two replicas: neither is taken into the
/// set by the other's rebuild. Before, adopting blade 1 recorded the fresh
/// blade 2 as its next blade, so blade 2 joined the set with none of what
/// the lost one held, and nothing refused it after.
#[test]
fn a_second_lost_blade_is_not_taken_into_the_set_by_a_rebuild() {
    let (mut blades, mut addrs) = three();
    smallbank(&addrs.join(","), "rb2-sb.json");
    lose(&mut blades, &mut addrs, 1);
    let list = lose(&mut blades, &mut addrs, 2);
    // Together: table 1 kept both its copies on blades 1 and 2.
    let (code, text) = rebuild(&list, "1,2");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("every copy of table 1 (2 replicas, on memory blades 1,2) was on the lost blades"), "{text}");
    for (lost, other) in [("1", "2"), ("2", "1")] {
        let (code, text) = rebuild(&list, lost);
        assert_eq!(code, Some(1), "{text}");
        assert!(
            text.contains(&format!("memory blade {other}")) && text.contains("has no place in the set either"),
            "{text}"
        );
    }
    let (code, _) = audit("smallbank", &list, "rb2-refused.json");
    assert_eq!(code, Some(1), "still refused");
}

/// With three replicas over three blades, any two blades lost together
/// are rebuilt from the third in one `rebuild --lost I,J` (blade 0 too,
/// from the mirrors on the blade that was not lost), every row back and the
/// audits clean; a rebuild of one of them alone is refused, naming the
/// other.
#[test]
fn two_lost_blades_are_rebuilt_together_from_the_third_replica() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--replicas", "3"];
    let sb = run_json("rb3-sb.json", &[&SMALLBANK[..], &q[..]].concat());
    let ta = run_json("rb3-tatp.json", &[&["tatp", "--subscribers", "2000", "--audit"], &q[..]].concat());
    assert_eq!((sb["violations"].as_u64(), ta["violations"].as_u64()), (Some(0), Some(0)));
    let rows_back = |list: &str, what: &str| {
        for (w, before) in [("smallbank", &sb), ("tatp", &ta)] {
            let (code, r) = audit(w, list, "rb3-audit.json");
            assert_eq!(code, Some(0), "{what}: {w}: {r}");
            assert_eq!(r["audit"]["db"]["live"], before["audit"]["db"]["live"], "{what}: {w}: every row is back");
        }
    };
    for (i, j) in [(1, 2), (0, 2), (0, 1)] {
        lose(&mut blades, &mut addrs, i);
        let list = lose(&mut blades, &mut addrs, j);
        let (code, text) = rebuild(&list, &i.to_string());
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains(&format!("memory blade {j}")) && text.contains("list every lost blade"), "{text}");
        let (code, text) = rebuild(&list, &format!("{j},{i}"));
        assert_eq!(code, Some(0), "{text}");
        // Three tables and five, two copies of each on the lost blades.
        assert!(text.contains(&format!("smallbank: rebuilt on memory blades {i},{j}: 6 bucket arrays")), "{text}");
        assert!(text.contains(&format!("tatp: rebuilt on memory blades {i},{j}: 10 bucket arrays")), "{text}");
        rows_back(&list, &format!("blades {i},{j}"));
        let (code, text) = rebuild(&list, &format!("{i},{j}"));
        assert!(code == Some(1) && text.contains("they were not lost"), "{text}");
    }
    // The rebuilt blades serve transactions.
    let list = addrs.join(",");
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--replicas", "3"];
    let again = run_json("rb3-again.json", &[&SMALLBANK[..], &q[..]].concat());
    assert_eq!(again["violations"].as_u64(), Some(0), "{again}");
}

/// A rebuild of two blades SIGKILLed at random points (the kill points
/// differ from run to run), three times, then run to its end: every row is
/// back and the audit is clean. Each run resumes what the one before left.
#[test]
fn a_rebuild_of_two_blades_killed_at_random_points_resumes_to_a_clean_audit() {
    let (mut blades, mut addrs) = three();
    let q = ["--blades", &addrs.join(","), "--duration", "0.3", "--warmup", "0", "--quiet", "--replicas", "3"];
    let big = ["smallbank", "--accounts", "50000", "--hot", "500", "--audit"];
    let sb = run_json("rbk-sb.json", &[&big[..], &q[..]].concat());
    lose(&mut blades, &mut addrs, 1);
    let list = lose(&mut blades, &mut addrs, 2);
    let mut killed = 0;
    for i in 0..3 {
        let mut child = Command::new(COMPUTE)
            .args(["rebuild", "--blades", &list, "--lost", "1,2", "--quiet"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(crate::cli::kill_point(i, 20, 250)));
        if child.try_wait().unwrap().is_none() {
            crate::cli::kill9(&mut child);
            killed += 1;
        } else {
            child.wait().unwrap();
        }
    }
    let (code, text) = rebuild(&list, "1,2");
    eprintln!("{killed} of 3 rebuilds killed; then: {text}");
    assert!(code == Some(0) || text.contains("they were not lost"), "{text}");
    smallbank_all_back(&list, &sb, "rbk-audit.json");
}

/// A rebuild of two blades that stopped between the two adoptions (its
/// mark set, the first blade adopted, the second not): other commands
/// refuse the database, a rebuild of the first blade alone is refused, and
/// the same rebuild run again adopts the second and finishes. For blades 1
/// and 2, and for blades 0 and 2.
#[test]
fn a_rebuild_of_two_blades_that_stopped_between_the_adoptions_resumes() {
    use smart_core::layout::{set_place, OFF_IDENTITY, OFF_SET_NEXT, OFF_SET_PLACE};
    use smart_core::{GlobalAddr, Runtime, RuntimeConfig, TcpTransport};
    for (first, refused) in
        [(1u16, "the rebuild in progress is of memory blades 1,2"), (0, "memory blade 2 has no place")]
    {
        let (mut blades, mut addrs) = three();
        let q = ["--blades", &addrs.join(","), "--duration", "0.3", "--warmup", "0", "--quiet", "--replicas", "3"];
        let sb = run_json("rb2r-sb.json", &[&SMALLBANK[..], &q[..]].concat());
        lose(&mut blades, &mut addrs, usize::from(first));
        let list = lose(&mut blades, &mut addrs, 2);
        let t = TcpTransport::connect(&addrs).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            ford_dtx::db::mark_rebuilding(&ctx, &[first, 2]).await.unwrap();
            // What the adoption writes for the first blade, and no more.
            let word = |b: u16, off: u64| ctx.read_u64(GlobalAddr::new(b, off));
            let (new, new2) = (word(first, OFF_IDENTITY).await.unwrap(), word(2, OFF_IDENTITY).await.unwrap());
            let head = if first == 0 {
                let head = word(1, OFF_SET_PLACE).await.unwrap() & !0xffff;
                let old = head | (new & 0xffff);
                assert_eq!(ctx.cas(GlobalAddr::new(0, OFF_IDENTITY), new, old).await.unwrap(), new);
                head
            } else {
                let old = word(0, OFF_SET_NEXT).await.unwrap();
                assert_eq!(ctx.cas(GlobalAddr::new(0, OFF_SET_NEXT), old, new).await.unwrap(), old);
                word(0, OFF_IDENTITY).await.unwrap()
            };
            ctx.cas(GlobalAddr::new(first, OFF_SET_PLACE), 0, set_place(head, first)).await.unwrap();
            let next = if first == 0 { word(1, OFF_IDENTITY).await.unwrap() } else { new2 };
            ctx.cas(GlobalAddr::new(first, OFF_SET_NEXT), 0, next).await.unwrap();
        });
        drop(rt);
        let (code, r) = audit("smallbank", &list, "rb2r-refused.json");
        assert_eq!(code, Some(1), "{r}");
        let (code, text) = rebuild(&list, &first.to_string());
        assert!(code == Some(1) && text.contains(refused), "{text}");
        let (code, text) = rebuild(&list, &format!("{first},2"));
        assert_eq!(code, Some(0), "{text}");
        smallbank_all_back(&list, &sb, "rb2r-audit.json");
    }
}

/// A mirror that went wrong (a word of its catalog's copy changed) fails
/// the audit, and `recover --repair` writes it anew.
#[test]
fn a_wrong_mirror_fails_the_audit_and_the_repair_writes_it_anew() {
    use smart_core::{Runtime, RuntimeConfig, TcpTransport};
    let (_blades, addrs) = three();
    let list = addrs.join(",");
    smallbank(&list, "rbm-sb.json");
    {
        let t = TcpTransport::connect(&addrs).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let at = ford_dtx::mirror::find(&ctx, 1, "smallbank").await.unwrap().unwrap();
            ctx.write(at.add(ford_dtx::layout::mirror::CATALOG as u64 + 16), &9u64.to_le_bytes()).await.unwrap();
        });
    }
    let (code, r) = audit("smallbank", &list, "rbm-bad.json");
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(r["audit"]["db"]["mirror"]["catalog_differs"], true, "{r}");
    let out = compute(&["recover", "--blades", &list, "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("smallbank: repair: its mirrors on the other memory blades written anew (one was wrong)"),
        "{text}"
    );
    let (code, r) = audit("smallbank", &list, "rbm-good.json");
    assert_eq!(code, Some(0), "{r}");
}
