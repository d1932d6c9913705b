//! Oracle tests for any [`KvIndex`]: run a sequence of operations against
//! the index and against a `BTreeMap`; every result must agree, and
//! afterwards the index must hold exactly the model's keys, once each.

use std::collections::BTreeMap;
use std::future::Future;

use proptest::prelude::*;
use smart_core::{Ctx, KvIndex, Runtime, RuntimeConfig, Transport};

/// One step of an oracle sequence: operations on key number `.0`, values
/// of `.1` bytes.
#[derive(Clone, Debug)]
pub enum Step {
    /// Insert if absent.
    Insert(u8, usize),
    /// Overwrite if present.
    Update(u8, usize),
    /// Insert or overwrite.
    Upsert(u8, usize),
    /// Remove.
    Delete(u8),
    /// Look up.
    Get(u8),
}

/// Steps over `keys` keys (few, so operations collide on them), values from
/// 1 byte to multi-line blocks.
pub fn step(keys: u8) -> impl Strategy<Value = Step> {
    let key = 0u8..keys;
    let len = prop::sample::select(vec![1usize, 8, 40, 100, 300]);
    prop_oneof![
        (key.clone(), len.clone()).prop_map(|(k, l)| Step::Insert(k, l)),
        (key.clone(), len.clone()).prop_map(|(k, l)| Step::Update(k, l)),
        (key.clone(), len).prop_map(|(k, l)| Step::Upsert(k, l)),
        key.clone().prop_map(Step::Delete),
        key.prop_map(Step::Get),
    ]
}

/// `cases` sequences of `len` steps over `keys` keys, drawn from `seed`
/// without proptest (for a program rather than a test): the same kinds of
/// steps and value lengths as [`step`].
pub fn random_steps(seed: u64, cases: usize, len: usize, keys: u8) -> Vec<Vec<Step>> {
    let mut x = seed | 1;
    let mut next = move |n: u64| {
        x = smart_core::hash::mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
        x % n
    };
    (0..cases)
        .map(|_| {
            (0..len)
                .map(|_| {
                    let (k, l) = (next(u64::from(keys)) as u8, [1, 8, 40, 100, 300][next(5) as usize]);
                    match next(5) {
                        0 => Step::Insert(k, l),
                        1 => Step::Update(k, l),
                        2 => Step::Upsert(k, l),
                        3 => Step::Delete(k),
                        _ => Step::Get(k),
                    }
                })
                .collect()
        })
        .collect()
}

/// The key of key number `k`.
pub fn key(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// The value written at step `i`, `len` bytes.
pub fn value(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 7 + j) as u8).collect()
}

/// Runs `steps` on a fresh runtime (thread 0 of `transport`) against the
/// index `open` returns and against a `BTreeMap`; every result must agree.
/// Then every model key must read back its value, and
/// [`KvIndex::audit`] must find exactly the model's keys, once each.
/// Returns the index's counters.
///
/// # Errors
/// The first disagreement, as a proptest failure.
///
/// # Panics
/// If the runtime cannot start or an operation returns an error.
pub fn check_against_model<I, F, Fut>(
    transport: &dyn Transport,
    cfg: RuntimeConfig,
    steps: &[Step],
    open: F,
) -> Result<I::Stats, TestCaseError>
where
    I: KvIndex,
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = I> + 'static,
{
    let mut rt = Runtime::new(transport, 0, cfg).expect("runtime");
    let opened = open(rt.ctx());
    let steps = steps.to_vec();
    rt.block_on(async move {
        let mut ix = opened.await;
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut out = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match *s {
                Step::Insert(k, l) => {
                    let present = model.contains_key(&key(k));
                    prop_assert_eq!(ix.insert(&key(k), &value(i, l)).await.unwrap(), !present, "step {}: {:?}", i, s);
                    model.entry(key(k)).or_insert(value(i, l));
                }
                Step::Update(k, l) => {
                    let present = model.contains_key(&key(k));
                    prop_assert_eq!(ix.update(&key(k), &value(i, l)).await.unwrap(), present, "step {}: {:?}", i, s);
                    if present {
                        model.insert(key(k), value(i, l));
                    }
                }
                Step::Upsert(k, l) => {
                    ix.upsert(&key(k), &value(i, l)).await.unwrap();
                    model.insert(key(k), value(i, l));
                }
                Step::Delete(k) => {
                    let present = model.remove(&key(k)).is_some();
                    prop_assert_eq!(ix.delete(&key(k)).await.unwrap(), present, "step {}: {:?}", i, s);
                }
                Step::Get(k) => {
                    let found = ix.get(&key(k), &mut out).await.unwrap();
                    prop_assert_eq!(found.then_some(&out), model.get(&key(k)), "step {}: {:?}", i, s);
                }
            }
        }
        for (k, v) in &model {
            prop_assert!(ix.get(k, &mut out).await.unwrap());
            prop_assert_eq!(&out, v);
        }
        let mut keys = ix.audit().await.unwrap().keys;
        keys.sort();
        let want: Vec<Vec<u8>> = model.keys().cloned().collect();
        prop_assert_eq!(keys, want, "the index holds exactly the model's keys, once each");
        Ok(ix.stats())
    })
}
