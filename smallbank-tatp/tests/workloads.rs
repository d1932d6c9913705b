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
use smallbank_tatp::smallbank::{self, cents, CHECKING, MIX, SAVINGS, START_CENTS};
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
    DtxConfig {
        db: name.into(),
        replicas: 2,
        retry_aborts: false,
        lease: Duration::from_secs(30),
        halt: None,
        fence_tag: None,
        fence_recorded: None,
        lost: Vec::new(),
        joining: Vec::new(),
        settle: Vec::new(),
    }
}

#[test]
fn a_sequential_smallbank_run_equals_the_model() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let w = SmallBank { accounts: 40, hot: 4, ledger: true, mix: MIX };
    let d = dtx("model");
    let opened = smallbank_tatp::workload::open(&*t, &cfg(1, 1, 1.0), &w, &d).unwrap();
    assert!(!opened.existed && opened.load);
    let db = opened.db.clone();
    let reg = Registration::register(t.clone(), opened.db, 1, 1, d.lease).unwrap();
    let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let (dx, ctx) = (reg.open_thread(rt.ctx()), rt.ctx());
    let w2 = w.clone();
    rt.block_on(async move {
        let mut tx = dx.txn(0);
        for a in 0..w2.accounts {
            w2.load(&mut tx, a).await.unwrap();
        }
        db.mark_loaded(&ctx).await.unwrap();
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
        let w = SmallBank { accounts: 300, hot: 8, ledger: true, mix: MIX };
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
    let w = Tatp::new(400);
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
    let w = Tatp::new(100_000);
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
    // SmallBank: one coin per transaction: 90% of pairs both hot, the rest
    // drawn from every account; a pair's accounts differ.
    let sb = SmallBank { accounts: 100_000, hot: 4_000, ledger: false, mix: MIX };
    let (mut both, mut one) = (0, 0);
    for _ in 0..10_000 {
        let [a, b, _] = sb.draw(&mut rng).keys;
        assert_ne!(a, b);
        both += usize::from(a < 4_000 && b < 4_000);
        one += usize::from((a < 4_000) != (b < 4_000));
    }
    // Cold pairs have a hot account with probability 2 × 4%.
    assert!((8_900..9_150).contains(&both) && (40..130).contains(&one), "{both} {one}");
    let tiny = SmallBank { accounts: 5, hot: 1, ledger: false, mix: MIX };
    assert!((0..1000).all(|_| {
        let [a, b, _] = tiny.draw(&mut rng).keys;
        a != b && a < 5 && b < 5
    }));
}

#[test]
fn a_mix_is_given_per_type_in_order_or_by_name_and_sums_to_100() {
    use smallbank_tatp::parse_mix;
    let sb = &smallbank::TYPES;
    assert_eq!(parse_mix("15,15,15,25,15,15", sb).unwrap(), MIX);
    assert_eq!(parse_mix(" 0, 100,0,0,0 ,0", sb).unwrap(), [0, 100, 0, 0, 0, 0]);
    assert_eq!(parse_mix("balance=60, send_payment=40", sb).unwrap(), [0, 60, 0, 40, 0, 0]);
    assert_eq!(parse_mix("get_subscriber_data=100", &tatp::TYPES).unwrap(), [100, 0, 0, 0, 0, 0, 0]);
    for (spec, says) in [
        ("15,15,15,25,15", "5 percentages for 6 transaction types"),
        ("15,15,15,25,15,16", "sum to 101, not 100"),
        ("balance=50", "sum to 50, not 100"),
        ("balance=50,balance=50", "balance is named twice"),
        ("balance=50,deposit=50", "no transaction type \"deposit\" (the types: amalgamate, balance"),
        ("balance=50,50", "use TYPE=PCT"),
        ("15,15,15,25,15,x", "\"x\" is not a percentage"),
        ("balance=101", "not a percentage (0 to 100)"),
        ("", "1 percentages for 6"),
    ] {
        let e = parse_mix(spec, sb).unwrap_err();
        assert!(e.contains(says), "{spec:?}: {e}");
    }
}

#[test]
fn the_generators_draw_the_mix_they_are_given() {
    let mut rng = SmallRng::seed_from_u64(3);
    let only = Tatp { mix: [0, 0, 0, 0, 100, 0, 0], ..Tatp::new(1000) };
    assert!((0..10_000).all(|_| only.draw(&mut rng).ty == 4));
    let sb = SmallBank { accounts: 1000, hot: 10, ledger: false, mix: [0, 60, 0, 40, 0, 0] };
    let mut n = [0u32; 6];
    for _ in 0..100_000 {
        n[sb.draw(&mut rng).ty] += 1;
    }
    assert_eq!((n[0], n[2], n[4], n[5]), (0, 0, 0, 0), "{n:?}");
    assert!((59_000..61_000).contains(&n[1]) && (39_000..41_000).contains(&n[3]), "{n:?}");
}

/// Loads rows `0..half` of `w` into database `name`, then every row (a load
/// that resumes one cut short, which runs over the rows already there);
/// returns the audit's live rows per table.
fn load_twice<W: Workload + Clone + 'static>(t: &Arc<dyn Transport>, w: &W, name: &str, half: u64) -> Vec<u64> {
    let d = dtx(name);
    let opened = smallbank_tatp::workload::open(&**t, &cfg(1, 1, 1.0), w, &d).unwrap();
    let reg = Registration::register(t.clone(), opened.db, 1, 1, d.lease).unwrap();
    let mut rt = Runtime::new(&**t, 0, RuntimeConfig::default()).unwrap();
    let dx = reg.open_thread(rt.ctx());
    let w2 = w.clone();
    rt.block_on(async move {
        let mut tx = dx.txn(0);
        for rows in [half, w2.rows()] {
            for row in 0..rows {
                w2.load(&mut tx, row).await.unwrap();
            }
        }
    });
    reg.close(&**t).unwrap();
    let a = smallbank_tatp::audit(&**t, &cfg(1, 1, 1.0), name, false).unwrap();
    assert_eq!(a.db.violations(), 0, "{a:?}");
    a.db.live
}

/// A load over rows already there (the next run finishing a load that was
/// cut short) keeps them and adds none: SmallBank's accounts and TATP's
/// subscribers with their access rows, special facilities and call
/// forwardings come out as one load makes them.
#[test]
fn a_load_over_rows_already_there_keeps_them_and_adds_none() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let sb = SmallBank { accounts: 500, hot: 8, ledger: false, mix: MIX };
    assert_eq!(load_twice(&t, &sb, "sb-twice", 200), vec![500, 500, 0]);
    let w = Tatp::new(300);
    let twice = load_twice(&t, &w, "tatp-twice", 120);
    let once = load_twice(&t, &w, "tatp-once", 0);
    assert_eq!(twice, once);
    assert_eq!(twice[tatp::SUBSCRIBER as usize], 300);
    assert!(twice[tatp::CALL_FORWARDING as usize] > 0, "{twice:?}");
}

/// Each TATP transaction type's success rate (committed over those that
/// ran to a decision: committed, or aborted because a row was missing,
/// present, or not selected) and how many decided.
fn success_rates(c: &smallbank_tatp::Counts) -> Vec<(f64, u64)> {
    let at = |a: Abort| Abort::ALL.iter().position(|x| *x == a).unwrap();
    (0..tatp::TYPES.len())
        .map(|ty| {
            let decided = c.committed[ty] + c.aborts[ty][at(Abort::NotFound)] + c.aborts[ty][at(Abort::Exists)];
            (c.committed[ty] as f64 / decided.max(1) as f64, decided)
        })
        .collect()
}

#[test]
fn tatp_transactions_succeed_as_often_as_the_specification_s_population_gives() {
    // The exact odds of GetNewDestination's query over the population's
    // rules: 27.8% of existing active facilities, 14.8% of all draws.
    let (given, all) = tatp::get_new_destination_odds();
    assert!((given - 0.2784).abs() < 0.001 && (all - 0.1479).abs() < 0.001, "{given} {all}");
    // The population's own draws agree with those rules.
    let (mut rows, mut facilities, mut active) = (0u64, 0u64, 0u64);
    for s in 1..20_000 {
        for (_, on, cf) in Tatp::population(s).sf {
            facilities += 1;
            active += u64::from(on);
            rows += cf.len() as u64;
            assert!(cf.iter().all(|&(st, end)| [0, 8, 16].contains(&st) && (st + 1..=st + 8).contains(&end)));
            assert!(cf.windows(2).all(|w| w[0].0 < w[1].0), "distinct start times");
        }
    }
    let per = |n: u64| n as f64 / facilities as f64;
    assert!((per(rows) - 1.5).abs() < 0.03 && (per(active) - 0.85).abs() < 0.01, "{} {}", per(rows), per(active));
    assert!((facilities as f64 / 19_999.0 - 2.5).abs() < 0.03);
    // Runs: each type succeeds as the specification's figures say (its
    // 23.9% for GetNewDestination excepted: see `tatp`'s docs), within 5
    // standard deviations of the draws made. Inserts and deletes of call
    // forwarding move the table away from its loaded population (their
    // end times are drawn 1..24, as the specification's), so the query's
    // odds are checked on a run without them (measured with them, at 2%
    // each: 16.8% after 2 s), and theirs on a run of the benchmark's mix.
    let b = backends::embedded_sized(2, 128 << 20);
    let t: Arc<dyn Transport> = b.transport.clone();
    let runs = [([35, 12, 35, 2, 16, 0, 0], "tatp-reads"), (tatp::MIX, "tatp-mix")];
    let expected = [1.0, all, 0.625, 0.625, 1.0, 0.3125, 0.3125];
    for (mix, db) in runs {
        let w = Tatp { mix, ..Tatp::new(20_000) };
        let rep = smallbank_tatp::run(t.clone(), &cfg(1, 4, 0.5), &w, &dtx(db)).unwrap();
        assert!(rep.run.first_error.is_none(), "{:?}", rep.run.first_error);
        for (ty, ((rate, n), p)) in success_rates(&rep.counts).into_iter().zip(expected).enumerate() {
            if mix[ty] == 0 || (mix == tatp::MIX && ty == 1) {
                continue;
            }
            assert!(n >= 100, "{}: only {n} decided", tatp::TYPES[ty]);
            let sd = (p * (1.0 - p) / n as f64).sqrt().max(0.002);
            assert!((rate - p).abs() < 5.0 * sd + 0.01, "{}: {rate:.4} over {n}, expected {p:.4}", tatp::TYPES[ty]);
        }
    }
}
