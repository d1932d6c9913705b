//! Memory blades as a set: data made over a list of blades is read only
//! over the same blades in the same order. A blade restarted without its
//! backing file, a list in another order, and a blade of another set are
//! refused by every subcommand before it reads anything.

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

fn micro(blades: &str) -> Vec<String> {
    ["micro", "--blades", blades, "--duration", "0.2", "--warmup", "0", "--threads", "1", "--quiet"]
        .map(String::from)
        .to_vec()
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
    let m = micro(&format!("{},localhost:{port}", a.addr));
    refused(&m.iter().map(String::as_str).collect::<Vec<_>>(), "the same blade under another address");
    // The second blade alone; the first alone is a prefix of the set.
    let m = micro(&b.addr);
    refused(&m.iter().map(String::as_str).collect::<Vec<_>>(), "another set");
    let m = micro(&a.addr);
    let out = compute(&m.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A new blade extends the set; another new one cannot then take its place.
    let c = Blade::start(&["--size", "64MiB"]);
    let three = format!("{blades},{}", c.addr);
    let m = micro(&three);
    let out = compute(&m.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = Blade::start(&["--size", "64MiB"]);
    let m = micro(&format!("{blades},{}", d.addr));
    refused(&m.iter().map(String::as_str).collect::<Vec<_>>(), "is not the blade that was blade 2");

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
