//! `compute-blade merge`: one record from the records of several compute
//! blades that ran together (started by a `--barrier`).
//!
//! Operations, errors and verb counters are summed; throughput is the sum of
//! each process's own (each measured over its own timed phase, which the
//! barrier started together); latency percentiles come from the merged
//! histogram, never from averaged percentiles; per-operation figures
//! (verbs, doorbells, retries, bytes) are weighted by each part's
//! operations; the per-second timelines are added second by second. Every
//! part is kept whole under `parts` (without its histogram), so the
//! subcommand's own fields (index counters, abort rates) stay readable per
//! process.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use smart_bench::latency::{empty_hdr, summary_of, LatencyHistogram};

/// Fields every part must agree on: a merge of different experiments is
/// refused (`mix`: the transaction mix of `smallbank` and `tatp`).
const SAME: [&str; 10] =
    ["bench", "app", "workload", "transport", "blades", "smart", "qp_policy", "cq", "coroutines", "mix"];

/// Per-operation fields, weighted by each part's `ops`.
const PER_OP: [&str; 5] =
    ["verbs_per_op", "doorbells_per_op", "retries_per_op", "bytes_read_per_op", "bytes_written_per_op"];

/// Reads the records at `paths` and merges them.
///
/// # Errors
/// A file that cannot be read or is not a run record, or parts of
/// different experiments.
pub fn merge_files(paths: &[PathBuf]) -> Result<Value> {
    if paths.is_empty() {
        bail!("merge: give the records to merge");
    }
    let parts = paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let v: Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not a JSON record", p.display()))?;
            Ok((p.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    merge(&parts)
}

fn num(v: &Value, k: &str, file: &Path) -> Result<f64> {
    v.get(k).and_then(Value::as_f64).with_context(|| format!("{}: no number {k:?}", file.display()))
}

/// Merges run records (`(file, record)` pairs; the file names the part in
/// errors and in the result).
///
/// # Errors
/// As [`merge_files`].
pub fn merge(parts: &[(PathBuf, Value)]) -> Result<Value> {
    let (first_file, first) = parts.first().context("merge: no records")?;
    // The parts' HdrHistograms, added; the largest sample of all, exactly.
    let mut hist = empty_hdr();
    let mut max = 0u64;
    let (mut ops, mut duration, mut mops, mut errors, mut threads) = (0u64, 0f64, 0f64, 0u64, 0u64);
    let mut per_op = [0f64; PER_OP.len()];
    let mut verbs = Map::new();
    let mut timeline: Vec<(f64, f64)> = Vec::new();
    let mut smart_state = Vec::new();
    let (mut interrupted, mut first_error) = (false, Value::Null);
    let mut kept = Vec::new();
    for (file, v) in parts {
        let h = v.get("latency_hist").with_context(|| {
            format!(
                "{}: not the record of a timed run (no latency_hist; a --load-only, table or older record?)",
                file.display()
            )
        })?;
        let h: LatencyHistogram =
            serde_json::from_value(h.clone()).with_context(|| format!("{}: latency_hist", file.display()))?;
        hist.add(h.decode().with_context(|| file.display().to_string())?)
            .map_err(|e| anyhow::anyhow!("{}: latency_hist: {e:?}", file.display()))?;
        max = max.max(h.max);
        for k in SAME {
            if v.get(k) != first.get(k) {
                bail!(
                    "{} and {} are different experiments: {k} is {} in one and {} in the other",
                    first_file.display(),
                    file.display(),
                    first.get(k).unwrap_or(&Value::Null),
                    v.get(k).unwrap_or(&Value::Null)
                );
            }
        }
        let o = num(v, "ops", file)? as u64;
        ops += o;
        duration = duration.max(num(v, "duration_s", file)?);
        mops += num(v, "throughput_mops", file)?;
        errors += num(v, "errors", file)? as u64;
        threads += num(v, "threads", file)? as u64;
        for (acc, k) in per_op.iter_mut().zip(PER_OP) {
            *acc += num(v, k, file)? * o as f64;
        }
        if let Some(m) = v.get("verbs").and_then(Value::as_object) {
            for (k, x) in m {
                let sum = match x {
                    // A distribution (ops by retries): bucket by bucket.
                    Value::Array(xs) => {
                        let have = verbs.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
                        let n = have.len().max(xs.len());
                        let at = |v: &[Value], i: usize| v.get(i).and_then(Value::as_u64).unwrap_or(0);
                        json!((0..n).map(|i| at(&have, i) + at(xs, i)).collect::<Vec<_>>())
                    }
                    _ => json!(verbs.get(k).and_then(Value::as_u64).unwrap_or(0) + x.as_u64().unwrap_or(0)),
                };
                verbs.insert(k.clone(), sum);
            }
        }
        for (i, s) in v.get("timeline").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let (t, m) = (s["t_s"].as_f64().unwrap_or(0.0), s["mops"].as_f64().unwrap_or(0.0));
            if i == timeline.len() {
                timeline.push((t, m));
            } else {
                timeline[i] = (timeline[i].0.max(t), timeline[i].1 + m);
            }
        }
        smart_state.extend(v.get("smart_state").and_then(Value::as_array).cloned().unwrap_or_default());
        interrupted |= v.get("interrupted").and_then(Value::as_bool).unwrap_or(false);
        if first_error.is_null() {
            first_error = v.get("first_error").cloned().unwrap_or(Value::Null);
        }
        let mut whole = v.clone();
        if let Some(o) = whole.as_object_mut() {
            o.remove("latency_hist");
            o.insert("file".into(), json!(file.display().to_string()));
        }
        kept.push(whole);
    }
    let weighted = |i: usize| if ops == 0 { 0.0 } else { per_op[i] / ops as f64 };
    let mut out = Map::new();
    for k in SAME {
        if let Some(x) = first.get(k) {
            out.insert(k.into(), x.clone());
        }
    }
    out.insert("merged".into(), json!(true));
    out.insert("processes".into(), json!(parts.len()));
    out.insert("threads".into(), json!(threads));
    out.insert("duration_s".into(), json!(duration));
    out.insert("ops".into(), json!(ops));
    out.insert("throughput_mops".into(), json!(mops));
    out.insert("latency_us".into(), serde_json::to_value(summary_of(&hist, max))?);
    for (i, k) in PER_OP.iter().enumerate() {
        out.insert((*k).into(), json!(weighted(i)));
    }
    out.insert("errors".into(), json!(errors));
    out.insert("verbs".into(), Value::Object(verbs));
    out.insert("smart_state".into(), Value::Array(smart_state));
    out.insert("zero_seconds".into(), json!(timeline.iter().filter(|(_, m)| *m == 0.0).count()));
    out.insert(
        "timeline".into(),
        timeline.iter().map(|(t, m)| json!({ "t_s": t, "mops": m })).collect::<Vec<_>>().into(),
    );
    out.insert("interrupted".into(), json!(interrupted));
    out.insert("first_error".into(), first_error);
    out.insert("latency_hist".into(), serde_json::to_value(LatencyHistogram::of(&hist, max))?);
    out.insert("parts".into(), Value::Array(kept));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smart_bench::latency::Latency;

    fn part(ops: u64, secs: f64, lat: &[u64], retries: f64) -> Value {
        let mut l = Latency::default();
        for &x in lat {
            l.record(x);
        }
        json!({
            "bench": "ycsb", "app": "race", "workload": "a", "transport": "tcp", "blades": 1,
            "smart": {"thd_res_alloc": true}, "qp_policy": "per-thread-db", "cq": "per-thread", "coroutines": 8,
            "threads": 2, "ops": ops, "duration_s": secs, "throughput_mops": ops as f64 / secs / 1e6,
            "verbs_per_op": 2.0, "doorbells_per_op": 1.0, "retries_per_op": retries,
            "bytes_read_per_op": 64.0, "bytes_written_per_op": 8.0, "errors": 0,
            "verbs": {"wrs": 2 * ops, "reads": ops, "ops_by_retries": [ops, 0, 1]}, "timeline": [{"t_s": 1.0, "mops": 1.0}],
            "latency_hist": l.to_histogram(), "latency_us": l.summary(),
        })
    }

    #[test]
    fn ops_add_up_and_percentiles_come_from_the_merged_histogram() {
        // One part fast, one slow: the merged p99 is the slow part's, which
        // no average of the two p99s gives.
        let a = part(1000, 1.0, &vec![1_000; 99], 0.0);
        let b = part(3000, 1.0, &[vec![1_000; 50], vec![500_000; 50]].concat(), 1.0);
        let m = merge(&[("a".into(), a), ("b".into(), b)]).unwrap();
        assert_eq!(m["ops"], 4000);
        assert_eq!(m["threads"], 4);
        assert_eq!(m["processes"], 2);
        assert_eq!(m["verbs"]["wrs"], 8000);
        assert_eq!(m["verbs"]["ops_by_retries"], json!([4000, 0, 2]));
        assert!((m["throughput_mops"].as_f64().unwrap() - 0.004).abs() < 1e-12);
        assert!((m["retries_per_op"].as_f64().unwrap() - 0.75).abs() < 1e-12);
        let mut all = Latency::default();
        for x in [vec![1_000; 149], vec![500_000; 50]].concat() {
            all.record(x);
        }
        assert_eq!(m["latency_us"]["p99"].as_f64().unwrap(), all.summary().p99);
        assert_eq!(m["latency_us"]["p50"].as_f64().unwrap(), all.summary().p50);
        assert_eq!(m["timeline"][0]["mops"], 2.0);
        assert_eq!(m["parts"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn different_experiments_and_records_without_a_histogram_are_refused() {
        let a = part(10, 1.0, &[5], 0.0);
        let mut b = part(10, 1.0, &[5], 0.0);
        b["workload"] = json!("c");
        let e = merge(&[("a".into(), a.clone()), ("b".into(), b)]).unwrap_err().to_string();
        assert!(e.contains("workload"), "{e}");
        // Transaction runs of two mixes.
        let (mut x, mut y) = (part(10, 1.0, &[5], 0.0), part(10, 1.0, &[5], 0.0));
        x["mix"] = json!({"balance": 100, "send_payment": 0});
        y["mix"] = json!({"balance": 0, "send_payment": 100});
        let e = merge(&[("x".into(), x.clone()), ("y".into(), y)]).unwrap_err().to_string();
        assert!(e.contains("mix is"), "{e}");
        assert_eq!(merge(&[("x".into(), x.clone()), ("x2".into(), x)]).unwrap()["mix"]["balance"], 100);
        let mut c = part(10, 1.0, &[5], 0.0);
        c.as_object_mut().unwrap().remove("latency_hist");
        let e = merge(&[("a".into(), a), ("c".into(), c)]).unwrap_err().to_string();
        assert!(e.contains("latency_hist"), "{e}");
    }
}
