//! Memory blades as a set: data made over a list of blades is read only
//! over the same blades in the same order. A blade restarted without its
//! backing file, a list in another order, and a blade of another set are
//! refused by every subcommand that reads data (all but `micro`) before it
//! reads anything.

use crate::cli::{compute, Blade};
use crate::dtx::run_json;

/// Runs `compute-blade ARGS`, which must fail with `says` in its message.
fn refused(args: &[&str], says: &str) -> String {
    let out = compute(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: expected {says:?} in: {err}");
    err
}

/// `compute-blade table list` on `blades` (quick, and it checks the set).
fn list(blades: &str) -> [&str; 4] {
    ["table", "list", "--blades", blades]
}

/// Runs `compute-blade ARGS`, which must succeed.
fn used(args: &[&str]) {
    let out = compute(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn blades_restarted_empty_listed_out_of_order_or_from_another_set_are_refused() {
    let (a, b) = (Blade::start(&["--size", "64MiB"]), Blade::start(&["--size", "64MiB"]));
    let blades = format!("{},{}", a.addr, b.addr);
    let db = ["smallbank", "--accounts", "2000", "--hot", "50", "--audit", "--quiet"];
    let r =
        run_json("set-load.json", &[&db[..], &["--blades", &blades, "--duration", "0.3", "--warmup", "0"]].concat());
    assert_eq!(r["violations"], 0, "{r}");

    // The same two blades the other way round.
    let swapped = format!("{},{}", b.addr, a.addr);
    let err = refused(&["smallbank", "--blades", &swapped, "--audit-only"], "listed in another order");
    assert!(err.contains(&format!("memory blade 0 ({})", b.addr)), "{err}");
    // One blade under two addresses.
    let port = a.addr.rsplit_once(':').unwrap().1;
    refused(&list(&format!("{},localhost:{port}", a.addr)), "the same blade under another address");
    // The second blade alone; the first alone is a prefix of the set.
    refused(&list(&b.addr), "another set");
    used(&list(&a.addr));
    // `micro` touches only what it allocates: it runs on any blades.
    used(&["micro", "--blades", &b.addr, "--duration", "0.2", "--warmup", "0", "--threads", "1", "--quiet"]);
    // A new blade extends the set; another new one cannot then take its place.
    let c = Blade::start(&["--size", "16MiB"]);
    used(&list(&format!("{blades},{}", c.addr)));
    let d = Blade::start(&["--size", "16MiB"]);
    refused(&list(&format!("{blades},{}", d.addr)), "is not the blade that was blade 2");

    // Blade 1 restarted without a backing file: its replicas are gone, and
    // the database is not read (before, the audit ran over the empty blade
    // and a run wrote to it).
    drop(b);
    let b = Blade::start(&["--size", "64MiB"]);
    let blades = format!("{},{}", a.addr, b.addr);
    for args in [
        &["smallbank", "--blades", &blades, "--audit-only"][..],
        &[&db[..], &["--blades", &blades, "--duration", "0.3", "--warmup", "0"]].concat(),
        &["recover", "--blades", &blades],
        &["table", "list", "--blades", &blades],
    ] {
        refused(args, "restarted without its backing file or replaced");
    }
    drop((a, b, c, d));
}
