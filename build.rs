//! Records the git commit the binaries are built from (for `--version` and
//! every result record's provenance).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}+dirty")
            } else {
                c
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=SMART_RS_COMMIT={commit}");
    // A new commit, a staged change or an edited source rebuilds the stamp
    // (so "+dirty" is current).
    for p in [
        ".git/HEAD",
        ".git/index",
        ".git/refs/heads",
        "src",
        "smart-core",
        "smart-bench",
        "smart-testkit",
        "race-ht",
        "ford-dtx",
        "sherman-bt",
        "ycsb",
        "smallbank-tatp",
        "scripts",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
