//! A sequential run equals a model of the same transactions.

use std::collections::HashMap;
use std::sync::Arc;

use ford_dtx::recovery::audit;
use ford_dtx::{Abort, TxnError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_core::Transport;
use smart_testkit::backends;

use crate::{open, spec, u};

#[test]
fn a_sequential_run_equals_the_model() {
    for b in backends::all(3) {
        let t: Arc<dyn Transport> = b.transport.clone();
        // Few buckets, so chains overflow too.
        let (mut rt, db, reg) = open(&t, &spec("oracle", &[8, 16], 20, 2), 1, 1);
        let dtx = reg.open_thread(rt.ctx());
        let ctx = rt.ctx();
        let name = b.name;
        rt.block_on(async move {
            let mut model: HashMap<(u32, u64), u64> = HashMap::new();
            let mut rng = SmallRng::seed_from_u64(99);
            let mut tx = dtx.txn(0);
            let val = |t: u32, v: u64| {
                let mut b = v.to_le_bytes().to_vec();
                b.resize(if t == 0 { 8 } else { 16 }, 0xab);
                b
            };
            for step in 0..1500 {
                tx.begin();
                // One to three distinct items, each a random operation.
                let n = rng.random_range(1..=3);
                let mut ops = Vec::new();
                while ops.len() < n {
                    let (t, k) = (rng.random_range(0..2u32), rng.random_range(0..60u64));
                    if ops.iter().any(|(tt, kk, _, _)| (*tt, *kk) == (t, k)) {
                        continue;
                    }
                    let op = rng.random_range(0..4);
                    let id = match op {
                        0 => tx.read(t, k),
                        1 => tx.update(t, k),
                        2 => tx.insert(t, k),
                        _ => tx.delete(t, k),
                    };
                    ops.push((t, k, op, id));
                }
                // What the model says.
                let expect = ops.iter().find_map(|(t, k, op, _)| match (op, model.contains_key(&(*t, *k))) {
                    (0 | 1 | 3, false) => Some(Abort::NotFound),
                    (2, true) => Some(Abort::Exists),
                    _ => None,
                });
                match tx.execute().await {
                    Ok(()) => assert_eq!(expect, None, "{name} step {step}: executed, model says {expect:?}"),
                    Err(TxnError::Abort(a)) => {
                        assert!(expect.is_some(), "{name} step {step}: aborted {a:?}, model says it runs");
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                }
                let new = step as u64 + 1_000;
                for (t, k, op, id) in &ops {
                    match op {
                        0 => assert_eq!(u(tx.value(*id)), model[&(*t, *k)], "{name} step {step}"),
                        1 => {
                            assert_eq!(u(tx.value(*id)), model[&(*t, *k)]);
                            tx.write(*id, &val(*t, new));
                        }
                        2 => tx.write(*id, &val(*t, new)),
                        _ => {}
                    }
                }
                tx.commit().await.unwrap();
                for (t, k, op, _) in &ops {
                    match op {
                        1 | 2 => {
                            model.insert((*t, *k), new);
                        }
                        3 => {
                            model.remove(&(*t, *k));
                        }
                        _ => {}
                    }
                }
            }
            let mut rows = HashMap::new();
            let rep = audit(&ctx, &db, |t, k, v| {
                rows.insert((t, k), u(v));
            })
            .await
            .unwrap();
            assert_eq!(rep.violations(), 0, "{name}: {rep:?}");
            assert_eq!(rows, model, "{name}: the database's rows are the model's");
        });
        reg.close(&*t).unwrap();
    }
}
