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
        let commands: [Vec<&str>; 10] = [
            [&["tatp", "--audit-only", "--subscribers", "2000"], &only[..]].concat(),
            [&["smallbank", "--audit-only", "--accounts", "2000", "--hot", "50"], &only[..]].concat(),
            [&["recover"], &only[..]].concat(),
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
    assert_eq!(answered.values().sum::<usize>(), 30, "{answered:?}");
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

#[test]
fn recover_releases_damaged_lock_words_that_no_compute_blade_can_hold() {
    let (dir, files) = two_backed_blades("orphan-locks");
    let (blades, list) = start_on(&files);
    let db = ["--accounts", "2000", "--hot", "50", "--audit", "--quiet", "--duration", "0.3", "--warmup", "0"];
    assert_eq!(run_json("orphans-load.json", &[&["smallbank", "--blades", &list][..], &db].concat())["violations"], 0);
    drop(blades);
    // A lock word of registry slot 200, which nobody holds; not a lock word.
    let words = [1 | 200 << 1 | 5 << 41, 0xdead_beef_0000];
    damage_locks(&files[0], &words);
    let (blades, list) = start_on(&files);
    let audit = |name| {
        let j = tmp(name);
        let out = Command::new(COMPUTE)
            .args(["smallbank", "--blades", &list, "--audit-only", "--quiet", "--json", j.to_str().unwrap()])
            .output()
            .unwrap();
        let r = crate::cli::record(&j);
        std::fs::remove_file(&j).unwrap();
        (out.status.code(), r["audit"]["db"]["locks_held"].as_u64())
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
