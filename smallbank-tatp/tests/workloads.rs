//! SmallBank and TATP: a sequential SmallBank run equals a model of the
//! same transactions; concurrent runs on the chaos backend conserve money
//! and keep replicas equal; the generators draw what the benchmarks
//! specify.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ford_dtx::{Abort, Registration, TxnError};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use smallbank_tatp::smallbank::{cents, CHECKING, MIX, SAVINGS, START_CENTS};
use smallbank_tatp::tatp::{self, Tatp};
use smallbank_tatp::{DtxConfig, SmallBank, Workload};
use smart_bench::harness::RunConfig;
use smart_core::{Runtime, RuntimeConfig, Transport};
use smart_testkit::backends;

fn cfg(threads: usize, coroutines: usize, secs: f64) -> RunConfig {
    RunConfig {
        threads,
        coroutines,
        duration: Duration::from_secs_f64(secs),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig { coroutines, ..RuntimeConfig::default() },
        ..RunConfig::default()
    }
}

fn dtx(name: &str) -> DtxConfig {
    DtxConfig { db: name.into(), replicas: 2, retry_aborts: false, lease: Duration::from_secs(30) }
}

#[test]
fn a_sequential_smallbank_run_equals_the_model() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let w = SmallBank { accounts: 40, hot: 4, ledger: true };
    let d = dtx("model");
    let (db, existed, _) = smallbank_tatp::workload::open(&*t, &cfg(1, 1, 1.0), &w, &d).unwrap();
    assert!(!existed);
    let reg = Registration::register(t.clone(), db, 1, 1, d.lease).unwrap();
    let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let dx = reg.open_thread(rt.ctx());
    let w2 = w.clone();
    rt.block_on(async move {
        let mut tx = dx.txn(0);
        for a in 0..w2.accounts {
            w2.load(&mut tx, a).await.unwrap();
        }
        w2.prepare(&mut tx, 1).await.unwrap();
        let mut sav: HashMap<u64, i64> = (0..w2.accounts).map(|a| (a, START_CENTS)).collect();
        let mut chk = sav.clone();
        let mut rng = SmallRng::seed_from_u64(5);
        let mut kinds = [0u32; 6];
        for step in 0..3000 {
            let d = w2.draw(&mut rng);
            let [a, b, _] = d.keys;
            let r = w2.run(&mut tx, &d, 1).await;
            kinds[d.ty] += 1;
            // The model.
            let want = match d.ty {
                0 => {
                    let total = sav[&a] + chk[&a];
                    sav.insert(a, 0);
                    chk.insert(a, 0);
                    *chk.get_mut(&b).unwrap() += total;
                    Ok(())
                }
                1 => Ok(()),
                2 => {
                    *chk.get_mut(&a).unwrap() += 130;
                    Ok(())
                }
                3 if chk[&a] < 500 => Err(Abort::User),
                3 => {
                    *chk.get_mut(&a).unwrap() -= 500;
                    *chk.get_mut(&b).unwrap() += 500;
                    Ok(())
                }
                4 => {
                    *sav.get_mut(&a).unwrap() += 2020;
                    Ok(())
                }
                _ => {
                    let take = if sav[&a] + chk[&a] < 500 { 600 } else { 500 };
                    *chk.get_mut(&a).unwrap() -= take;
                    Ok(())
                }
            };
            match (r, want) {
                (Ok(()), Ok(())) => {}
                (Err(TxnError::Abort(x)), Err(y)) if x == y => {}
                (r, want) => panic!("step {step} {d:?}: ran {r:?}, model {want:?}"),
            }
        }
        assert!(kinds.iter().all(|k| *k > 0), "every type drawn: {kinds:?}");
        // Every balance as the model has it.
        for a in 0..w2.accounts {
            tx.begin();
            let (s, c) = (tx.read(SAVINGS, a), tx.read(CHECKING, a));
            tx.execute().await.unwrap();
            assert_eq!((cents(tx.value(s)), cents(tx.value(c))), (sav[&a], chk[&a]), "account {a}");
        }
    });
    reg.close(&*t).unwrap();
    let audit = smallbank_tatp::audit(&*t, &cfg(1, 1, 1.0), "model", true).unwrap();
    assert_eq!(audit.violations, 0, "{audit:?}");
}

#[test]
fn concurrent_smallbank_on_chaos_conserves_money() {
    let b = backends::chaos_sized(3, 32 << 20, 9);
    let t: Arc<dyn Transport> = b.transport.clone();
    for retry in [false, true] {
        let w = SmallBank { accounts: 300, hot: 8, ledger: true };
        let d = DtxConfig { retry_aborts: retry, ..dtx(&format!("chaos-{retry}")) };
        let rep = smallbank_tatp::run(t.clone(), &cfg(2, 4, 0.7), &w, &d).unwrap();
        assert!(rep.run.first_error.is_none(), "{:?}", rep.run.first_error);
        let c = &rep.counts;
        assert!(c.total_committed() > 100, "{c:?}");
        assert!(c.aborts_of(Abort::Locked) + c.aborts_of(Abort::Validation) > 0, "a hot set of 8 conflicts");
        let a = smallbank_tatp::audit(&*t, &cfg(1, 1, 1.0), &d.db, true).unwrap();
        assert_eq!(a.violations, 0, "{a:?}");
        assert_eq!(a.balances, a.expected);
        // Every committed money-moving transaction is in the ledgers.
        let moving: u64 = [2, 4, 5].iter().map(|i| c.committed[*i]).sum();
        assert!(a.ledger_txns.unwrap() >= moving);
    }
}

#[test]
fn tatp_runs_with_inserts_and_deletes_and_keeps_replicas_equal() {
    let b = backends::chaos_sized(2, 32 << 20, 4);
    let t: Arc<dyn Transport> = b.transport.clone();
    let w = Tatp { subscribers: 400 };
    let rep = smallbank_tatp::run(t.clone(), &cfg(2, 4, 0.7), &w, &dtx("tatp")).unwrap();
    assert!(rep.run.first_error.is_none(), "{:?}", rep.run.first_error);
    let c = &rep.counts;
    assert!(c.committed[5] > 0 && c.committed[6] > 0, "inserts and deletes commit: {c:?}");
    assert!(c.aborts_of(Abort::NotFound) > 0);
    let a = smallbank_tatp::audit(&*t, &cfg(1, 1, 1.0), "tatp", false).unwrap();
    assert_eq!(a.violations, 0, "{a:?}");
    assert_eq!(a.db.live[tatp::SUBSCRIBER as usize], 400);
}

#[test]
fn the_generators_draw_what_the_benchmarks_specify() {
    // Mixes sum to 100%.
    assert_eq!(MIX.iter().sum::<u32>(), 100);
    assert_eq!(tatp::MIX.iter().sum::<u32>(), 100);
    // NURand ids are in range and skewed.
    let w = Tatp { subscribers: 100_000 };
    assert_eq!(w.nurand_a(), 65_535);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut counts = vec![0u32; 100_001];
    for _ in 0..200_000 {
        let s = w.subscriber(&mut rng);
        assert!((1..=100_000).contains(&s));
        counts[s as usize] += 1;
    }
    let max = *counts.iter().max().unwrap();
    assert!(max > 10, "NURand is non-uniform (max {max} draws of one id)");
    // Populations are deterministic, 1-4 distinct types each.
    for s in 1..200 {
        let p = Tatp::population(s);
        assert_eq!(p, Tatp::population(s));
        assert!((1..=4).contains(&p.ai.len()) && (1..=4).contains(&p.sf.len()));
        let mut ai = p.ai.clone();
        ai.dedup();
        assert_eq!(ai.len(), p.ai.len());
    }
    // Keys of different rows never collide.
    let mut seen = std::collections::HashSet::new();
    for s in 1..100 {
        for t in 1..=4 {
            assert!(seen.insert(("ai", tatp::ai_key(s, t))));
            assert!(seen.insert(("sf", tatp::sf_key(s, t))));
            for st in [0, 8, 16] {
                assert!(seen.insert(("cf", tatp::cf_key(s, t, st))));
            }
        }
    }
    // SmallBank: 90% of draws hit the hot set.
    let sb = SmallBank { accounts: 100_000, hot: 4_000, ledger: false };
    let hot = (0..10_000).filter(|_| sb.draw(&mut rng).keys[0] < 4_000).count();
    assert!((8_900..9_300).contains(&hot), "{hot}");
}
