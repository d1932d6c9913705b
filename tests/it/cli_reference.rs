//! The guide's command-line reference (`docs/book/src/reference/cli.md`) is
//! generated from the binaries' own `--help`, so it cannot drift from the
//! clap definitions: this test renders it and fails when the committed file
//! differs. `SMART_RS_BLESS=1 cargo test --release -p smart --test it
//! cli_reference` writes it anew.

use std::path::Path;
use std::process::Command;

use super::cli::{BLADE, COMPUTE};

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).arg("--help").output().expect("run --help");
    assert!(out.status.success(), "{bin} {args:?} --help failed: {}", String::from_utf8_lossy(&out.stderr));
    // Trailing spaces (clap pads blank lines) are dropped, so editors keep the file as it is.
    let text = String::from_utf8(out.stdout).expect("UTF-8 help");
    text.lines().map(str::trim_end).collect::<Vec<_>>().join("\n")
}

/// The subcommands `compute-blade --help` lists, in its order (so a new one
/// is documented without touching this test).
fn subcommands() -> Vec<String> {
    let top = help(COMPUTE, &[]);
    let list = top.split("Commands:").nth(1).expect("a Commands section");
    list.lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

fn render() -> String {
    let mut md = String::from(
        "# Command line\n\n\
         <!-- Generated from the binaries' --help by tests/it/cli_reference.rs; do not edit by hand:\n\
         SMART_RS_BLESS=1 cargo test --release -p smart --test it cli_reference -->\n\n\
         Every flag of both binaries, as their `--help` prints it. Sizes take suffixes (`4096`,\n\
         `64K`/`64KiB`, `16MiB`, `1GiB` are binary; `KB`, `MB`, `GB` decimal). An unknown flag or\n\
         a malformed value exits with status 2; a value out of range, a failure, or a violation\n\
         found exits with 1; a run stopped by SIGINT or SIGTERM with 130.\n\n",
    );
    let mut section = |title: &str, text: String| {
        md += &format!("## `{title}`\n\n```text\n{text}\n```\n\n");
    };
    section("memory-blade", help(BLADE, &[]));
    section("compute-blade", help(COMPUTE, &[]));
    for sub in subcommands() {
        section(&format!("compute-blade {sub}"), help(COMPUTE, &[&sub]));
    }
    md.truncate(md.trim_end().len());
    md.push('\n');
    md
}

#[test]
fn cli_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/book/src/reference/cli.md");
    let want = render();
    assert!(want.contains("## `compute-blade micro`") && want.contains("--threads"), "the help was rendered");
    if std::env::var_os("SMART_RS_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write the CLI reference");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not the binaries' --help: run SMART_RS_BLESS=1 cargo test --release -p smart --test it cli_reference",
        path.display()
    );
}
