//! Blade memory damaged at random behind the processes' backs (words of
//! the blades' backing files overwritten while the blades are down): every
//! command still ends with an answer (success, an error, or a violation),
//! and none panics, dies of a signal or hangs.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_core::layout::{HEAP_START, OFF_HEAP};

use crate::cli::{tmp, wait_bounded, Blade, COMPUTE};
use crate::dtx::run_json;

/// Overwrites `words` random 8-byte words of the used heap of the backing
/// file `path`.
fn damage(path: &Path, rng: &mut SmallRng, words: usize) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut w = [0u8; 8];
    f.read_exact_at(&mut w, OFF_HEAP).unwrap();
    let heap_end = u64::from_le_bytes(w);
    assert!(heap_end > HEAP_START, "{}: nothing allocated", path.display());
    for _ in 0..words {
        let at = rng.random_range(HEAP_START..heap_end) & !7;
        f.write_all_at(&rng.random::<u64>().to_le_bytes(), at).unwrap();
    }
}

/// Runs `compute-blade args` (at most 60 s) and checks that it answered:
/// exit status 0 or 1, no panic.
fn answers(args: &[&str]) -> String {
    let out = tmp("damage-out");
    let mut child = Command::new(COMPUTE)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::from(std::fs::File::create(out.with_extension("err")).unwrap()))
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(60), &format!("{args:?} hung"));
    let text = std::fs::read_to_string(&out).unwrap() + &std::fs::read_to_string(out.with_extension("err")).unwrap();
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_file(out.with_extension("err")).unwrap();
    assert!(matches!(status.code(), Some(0 | 1)) && !text.contains("panicked"), "{args:?}: {status}: {text}");
    let said = text.lines().find(|l| l.starts_with("Error:")).or_else(|| text.lines().rfind(|l| !l.starts_with(' ')));
    said.unwrap_or("").to_string()
}

/// A new directory `name` under the tests' temporary directory, and the
/// paths of two backing files in it (for [`start_on`]).
fn two_backed_blades(name: &str) -> (std::path::PathBuf, [std::path::PathBuf; 2]) {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).unwrap();
    let files = [dir.join("b0"), dir.join("b1")];
    (dir, files)
}

/// Starts a memory blade on each of `files`; returns them and their
/// `--blades` list.
fn start_on(files: &[std::path::PathBuf; 2]) -> ([Blade; 2], String) {
    let b = files.each_ref().map(|f| Blade::start(&["--size", "64MiB", "--backing-file", f.to_str().unwrap()]));
    let list = format!("{},{}", b[0].addr, b[1].addr);
    (b, list)
}

#[test]
fn commands_on_randomly_damaged_blades_answer_and_never_crash() {
    let (dir, files) = two_backed_blades("damage");
    // A SmallBank and a TATP database over both blades, a RACE table and a
    // B+tree: each structure on the blades, in a known good state.
    {
        let (_blades, bl) = start_on(&files);
        let q = ["--blades", &bl, "--duration", "0.2", "--warmup", "0", "--quiet"];
        run_json("dmg-tatp.json", &[&["tatp", "--subscribers", "2000"], &q[..]].concat());
        run_json("dmg-sb.json", &[&["smallbank", "--accounts", "2000", "--hot", "50", "--audit"], &q[..]].concat());
        for app in ["race", "sherman"] {
            run_json(
                "dmg-ycsb.json",
                &["ycsb", "--blades", &bl, "--app", app, "--table", app, "--keys", "3000", "--load-only", "--quiet"],
            );
        }
    }
    for f in &files {
        std::fs::copy(f, f.with_extension("good")).unwrap();
    }
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for seed in 0..3u64 {
        // Other words every run (the seed is printed to reproduce a failure).
        let s = seed ^ u64::from(std::process::id()) << 8;
        eprintln!("damage: seed {s}, 200 words per blade");
        let mut rng = SmallRng::seed_from_u64(s);
        for f in &files {
            std::fs::copy(f.with_extension("good"), f).unwrap();
            damage(f, &mut rng, 200);
        }
        let (blades, bl) = start_on(&files);
        let run = ["--blades", bl.as_str(), "--duration", "0.3", "--warmup", "0", "--quiet"];
        let only = ["--blades", bl.as_str()];
        let commands: [Vec<&str>; 11] = [
            [&["tatp", "--audit-only", "--subscribers", "2000"], &only[..]].concat(),
            [&["smallbank", "--audit-only", "--accounts", "2000", "--hot", "50"], &only[..]].concat(),
            [&["recover"], &only[..]].concat(),
            [&["recover", "--repair"], &only[..]].concat(),
            [&["tatp", "--subscribers", "2000"], &run[..]].concat(),
            [&["smallbank", "--accounts", "2000", "--hot", "50", "--audit"], &run[..]].concat(),
            [&["table", "list"], &only[..]].concat(),
            [&["table", "check", "race"], &only[..]].concat(),
            [&["table", "check", "sherman", "--app", "sherman"], &only[..]].concat(),
            [&["ycsb", "--app", "race", "--table", "race", "--keys", "3000", "--no-load", "--verify"], &run[..]]
                .concat(),
            [&["ycsb", "--app", "sherman", "--table", "sherman", "--keys", "3000", "--workload", "e"], &run[..]]
                .concat()
                .into_iter()
                .chain(["--no-load", "--verify"])
                .collect(),
        ];
        for c in &commands {
            let last = answers(c);
            eprintln!("seed {seed}: {} {}: {last}", c[0], c[1]);
            *answered.entry(c[..2].join(" ")).or_default() += 1;
        }
        drop(blades);
    }
    assert_eq!(answered.values().sum::<usize>(), 33, "{answered:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes `words` into the lock words of the first SmallBank records (8-byte
/// values, whose primary is on blade 0) found in blade 0's backing file.
fn damage_locks(path: &Path, words: &[u64]) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut heap = vec![0u8; 16 << 20];
    f.read_exact_at(&mut heap, 0).unwrap();
    let w = |o: usize| u64::from_le_bytes(heap[o..o + 8].try_into().unwrap());
    // A record at `o` on blade 0 names itself as its primary (`home`, @24).
    let records =
        (HEAP_START as usize..heap.len() - 64).step_by(64).filter(|o| w(o + 24) == *o as u64 && w(o + 8) == 8);
    let mut n = 0;
    for (o, word) in records.zip(words) {
        f.write_all_at(&word.to_le_bytes(), o as u64 + 40).unwrap();
        n += 1;
    }
    assert_eq!(n, words.len(), "records found");
}

/// A SmallBank database of 2 000 accounts, loaded and run with its audit,
/// on two backed blades, which are stopped: the directory and the files.
fn smallbank_on_backed_blades(name: &str) -> (std::path::PathBuf, [std::path::PathBuf; 2]) {
    let (dir, files) = two_backed_blades(name);
    let (_blades, list) = start_on(&files);
    let db = ["--accounts", "2000", "--hot", "50", "--audit", "--quiet", "--duration", "0.3", "--warmup", "0"];
    let load = format!("{name}-load.json");
    assert_eq!(run_json(&load, &[&["smallbank", "--blades", &list][..], &db].concat())["violations"], 0);
    (dir, files)
}

/// `compute-blade smallbank --audit-only` on `list`: its exit status and
/// the record's audit of the database.
fn audit_smallbank(list: &str, name: &str) -> (Option<i32>, serde_json::Value) {
    let j = tmp(name);
    let out = Command::new(COMPUTE)
        .args(["smallbank", "--blades", list, "--audit-only", "--quiet", "--json", j.to_str().unwrap()])
        .output()
        .unwrap();
    let r = crate::cli::record(&j);
    std::fs::remove_file(&j).unwrap();
    (out.status.code(), r["audit"]["db"].clone())
}

#[test]
fn recover_releases_damaged_lock_words_that_no_compute_blade_can_hold() {
    let (dir, files) = smallbank_on_backed_blades("orphan-locks");
    // A lock word of registry slot 200, which nobody holds; not a lock word.
    let words = [1 | 200 << 1 | 5 << 41, 0xdead_beef_0000];
    damage_locks(&files[0], &words);
    let (blades, list) = start_on(&files);
    let audit = |name| {
        let (code, db) = audit_smallbank(&list, name);
        (code, db["locks_held"].as_u64())
    };
    assert_eq!(audit("orphans-audit1.json"), (Some(1), Some(2)), "two damaged locks held");
    let r = run_json("orphans-recover.json", &["recover", "--blades", &list, "--db", "smallbank"]);
    let o = &r["databases"][0]["orphan_locks"];
    assert_eq!((o["held"].as_u64(), o["released"].as_u64()), (Some(2), Some(2)), "{r}");
    let mut shown: Vec<u64> = o["shown"].as_array().unwrap().iter().map(|h| h["word"].as_u64().unwrap()).collect();
    shown.sort_unstable();
    assert_eq!(shown, words);
    assert_eq!(audit("orphans-audit2.json"), (Some(0), Some(0)), "released, the audit is clean");
    drop(blades);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Offsets of the SmallBank records (8-byte values) in the backing file
/// `path` of blade `blade` whose primary copy is at `home` on blade
/// `home_blade`, or with `home: None` of every record that is its own
/// primary (on blade `blade`).
fn records_in(path: &Path, blade: u16, home: Option<(u16, u64)>) -> Vec<u64> {
    let heap = std::fs::read(path).unwrap();
    let w = |o: usize| u64::from_le_bytes(heap[o..o + 8].try_into().unwrap());
    let want = |o: usize| match home {
        Some((b, at)) => smart_core::GlobalAddr::new(b, at).raw(),
        None => smart_core::GlobalAddr::new(blade, o as u64).raw(),
    };
    (HEAP_START as usize..heap.len() - 64)
        .step_by(8)
        .filter(|o| w(o + 8) == 8 && w(o + 24) == want(*o) && heap[o + 56] != 0)
        .map(|o| o as u64)
        .collect()
}

/// Flips a bit of the value of the record at `at` in `path` (its CRC then
/// fails).
fn flip_value(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at + 48).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at + 48).unwrap();
}

#[test]
fn recover_repair_restores_damaged_records_from_their_replicas_and_names_the_lost() {
    let (dir, files) = smallbank_on_backed_blades("repair");
    // Three primaries damaged on each blade; then one record on both.
    let ours = [records_in(&files[0], 0, None), records_in(&files[1], 1, None)];
    for (f, recs) in files.iter().zip(&ours) {
        assert!(recs.len() > 100, "{}: {} records", f.display(), recs.len());
        for at in &recs[..3] {
            flip_value(f, *at);
        }
    }
    let lost = ours[0][10];
    let backup = records_in(&files[1], 1, Some((0, lost)));
    assert_eq!(backup.len(), 1, "the backup of b0:{lost:#x}");
    flip_value(&files[0], lost);
    flip_value(&files[1], backup[0]);

    let (blades, list) = start_on(&files);
    let audit = |name| {
        let (code, db) = audit_smallbank(&list, name);
        (code, db["torn"].as_u64(), db["replica_mismatches"].as_u64())
    };
    assert_eq!(
        audit("repair-audit1.json"),
        (Some(1), Some(7), Some(6)),
        "7 primaries fail their CRC; the lost one's copies alike"
    );
    let j = tmp("repair.json");
    let out = Command::new(COMPUTE)
        .args(["recover", "--repair", "--blades", &list, "--db", "smallbank", "--json", j.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "one record is left damaged: {text}");
    assert!(
        text.contains(
            "smallbank: repair: 7 damaged records, 6 repaired (6 copies rewritten), 0 chain words repaired; left: 0 \
             locked, 1 unrepairable, 0 after a gap, 0 chains cut"
        ) && text.contains(&format!("at b0:{lost:#x}: no copy passes its check"))
            && text.contains("the repair of \"smallbank\" left damage: 1 records or chains"),
        "{text}"
    );
    let r = crate::cli::record(&j);
    std::fs::remove_file(&j).unwrap();
    let rep = &r["databases"][0]["repair"];
    assert_eq!((rep["repaired"].as_u64(), rep["unrepairable"].as_u64()), (Some(6), Some(1)), "{r}");
    assert_eq!(audit("repair-audit2.json"), (Some(1), Some(1), Some(0)), "only the lost record is left");
    drop(blades);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Offsets of the SmallBank rows (8-byte values, primaries and backups) in
/// the backing file `path`: records that pass their check.
fn rows_in(path: &Path) -> Vec<usize> {
    let heap = std::fs::read(path).unwrap();
    let w = |o: usize| u64::from_le_bytes(heap[o..o + 8].try_into().unwrap());
    (HEAP_START as usize..heap.len() - 64)
        .step_by(8)
        .filter(|o| {
            w(o + 8) == 8
                && heap[o + 56] != 0
                && smart_core::GlobalAddr::from_raw(w(o + 24)).blade() < 2
                && ford_dtx::layout::decode(&heap[*o..o + 64], 8).is_ok()
        })
        .collect()
}

/// A SmallBank database of 2 000 accounts on two backed blades, loaded and
/// run, then with 300 random words written over random rows of blade 0
/// while the blades are down (its copy of each record hit is damaged; the
/// other blade's is whole). Returns the directory, the files, blade 0's
/// file before the damage, its rows, and the seed.
fn smallbank_damaged_on_blade_0(name: &str) -> (std::path::PathBuf, [std::path::PathBuf; 2], Vec<u8>, Vec<usize>, u64) {
    let (dir, files) = smallbank_on_backed_blades(name);
    let good = std::fs::read(&files[0]).unwrap();
    let rows = rows_in(&files[0]);
    assert!(rows.len() >= 4000, "{} rows on blade 0 (2 000 accounts × 2 tables, primaries and backups)", rows.len());
    let seed = u64::from(std::process::id()) ^ name.len() as u64;
    eprintln!("{name}: seed {seed}, 300 words");
    let mut rng = SmallRng::seed_from_u64(seed);
    let f = std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap();
    for _ in 0..300 {
        let at = rows[rng.random_range(0..rows.len())] + 8 * rng.random_range(0..8);
        f.write_all_at(&rng.random::<u64>().to_le_bytes(), at as u64).unwrap();
    }
    (dir, files, good, rows, seed)
}

/// Runs `compute-blade recover --repair` on smallbank: its exit status and
/// output.
fn repair_smallbank(list: &str) -> (Option<i32>, String) {
    let out =
        Command::new(COMPUTE).args(["recover", "--repair", "--blades", list, "--db", "smallbank"]).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn random_damage_to_one_blades_rows_is_repaired_whole() {
    let (dir, files, good, rows, seed) = smallbank_damaged_on_blade_0("repair-random");
    let (blades, list) = start_on(&files);
    let (code, text) = repair_smallbank(&list);
    assert!(
        code == Some(0) && text.contains("left: 0 locked, 0 unrepairable, 0 after a gap, 0 chains cut"),
        "seed {seed}: {text}"
    );
    let audit = Command::new(COMPUTE).args(["smallbank", "--audit-only", "--blades", &list]).output().unwrap();
    assert!(audit.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&audit.stdout));
    drop(blades);
    // Every row of blade 0 is as it was, its lock word free.
    let now = std::fs::read(&files[0]).unwrap();
    for o in rows {
        assert_eq!(
            (&now[o..o + 40], &now[o + 48..o + 64]),
            (&good[o..o + 40], &good[o + 48..o + 64]),
            "seed {seed}: the row at b0:{o:#x}"
        );
        assert_eq!(&now[o + 40..o + 48], &[0; 8], "seed {seed}: the lock of the row at b0:{o:#x}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_repair_beside_running_transactions_keeps_the_money() {
    let (dir, files, _, _, seed) = smallbank_damaged_on_blade_0("repair-live");
    let (blades, list) = start_on(&files);
    // Transactions run on the damaged database (those that meet a damaged
    // primary abort) while a repair runs; a record a transaction holds is
    // left to the next repair.
    // (`--audit`: the run keeps the ledgers, which the audit after needs.)
    let run = ["smallbank", "--blades", &list, "--accounts", "2000", "--hot", "50", "--quiet", "--audit"];
    let mut child =
        crate::cli::spawn_compute(&[&run[..], &["--threads", "2", "--duration", "3", "--warmup", "0"]].concat());
    std::thread::sleep(Duration::from_millis(800));
    let (code, first) = repair_smallbank(&list);
    assert!(matches!(code, Some(0 | 1)) && first.contains("smallbank: repair:"), "seed {seed}: {first}");
    let st = wait_bounded(&mut child, Duration::from_secs(60), "the smallbank run");
    // Its own audit (at its end) fails if damage the repair left was not
    // written over by a commit since: exit status 1.
    assert!(matches!(st.code(), Some(0 | 1)), "seed {seed}: the run beside the repair: {st}");
    let (code, second) = repair_smallbank(&list);
    assert_eq!(code, Some(0), "seed {seed}: after the run, nothing is left: {first}\n{second}");
    let audit = Command::new(COMPUTE).args(["smallbank", "--audit-only", "--blades", &list]).output().unwrap();
    assert!(audit.status.success(), "seed {seed}: {first}\n{second}\n{}", String::from_utf8_lossy(&audit.stdout));
    drop(blades);
    std::fs::remove_dir_all(&dir).unwrap();
}
