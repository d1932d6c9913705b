//! Operation sequences against a `BTreeMap`, from an empty tree and from a
//! bulk-loaded one, with and without speculative lookup.

use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::prelude::*;
use smart_core::EmbeddedTransport;

use crate::{checked_keys, on_tree};

#[derive(Clone, Debug)]
enum Step {
    Insert(u64),
    Update(u64),
    Upsert(u64),
    Delete(u64),
    Get(u64),
    Scan(u64, usize),
}

/// Steps over keys `0..keys` (spread out by 1000 so separators land between
/// them), scans of up to 120 pairs.
fn step(keys: u64) -> impl Strategy<Value = Step> {
    let k = (0..keys).prop_map(|k| k * 1000);
    prop_oneof![
        3 => k.clone().prop_map(Step::Insert),
        1 => k.clone().prop_map(Step::Update),
        2 => k.clone().prop_map(Step::Upsert),
        2 => k.clone().prop_map(Step::Delete),
        2 => k.clone().prop_map(Step::Get),
        1 => (0..keys * 1000, 0usize..120).prop_map(|(s, n)| Step::Scan(s, n)),
    ]
}

fn check(bulk: u64, steps: &[Step], smart: &'static str) -> Result<(), TestCaseError> {
    let t = EmbeddedTransport::new(2, 16 << 20).unwrap();
    let steps = steps.to_vec();
    let model = on_tree(&t, 0, smart, "oracle", move |mut tree| async move {
        let mut model = BTreeMap::new();
        // Bulk load: keys between the steps' keys, so both mix in leaves.
        for i in 0..bulk {
            let k = i * 1000 + 500;
            tree.insert_u64(k, k).await.unwrap();
            model.insert(k, k);
        }
        let mut out = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let v = i as u64 + 1;
            match *s {
                Step::Insert(k) => {
                    let absent = !model.contains_key(&k);
                    prop_assert_eq!(tree.insert_u64(k, v).await.unwrap(), absent, "step {}: {:?}", i, s);
                    model.entry(k).or_insert(v);
                }
                Step::Update(k) => {
                    let present = model.contains_key(&k);
                    prop_assert_eq!(tree.update_u64(k, v).await.unwrap(), present, "step {}: {:?}", i, s);
                    if present {
                        model.insert(k, v);
                    }
                }
                Step::Upsert(k) => {
                    tree.upsert_u64(k, v).await.unwrap();
                    model.insert(k, v);
                }
                Step::Delete(k) => {
                    let present = model.remove(&k).is_some();
                    prop_assert_eq!(tree.delete_u64(k).await.unwrap(), present, "step {}: {:?}", i, s);
                }
                Step::Get(k) => {
                    prop_assert_eq!(tree.get_u64(k).await.unwrap(), model.get(&k).copied(), "step {}: {:?}", i, s);
                }
                Step::Scan(from, n) => {
                    tree.scan_u64(from, n, &mut out).await.unwrap();
                    let want: Vec<(u64, u64)> =
                        model.range((Bound::Included(from), Bound::Unbounded)).take(n).map(|(k, v)| (*k, *v)).collect();
                    prop_assert_eq!(&out, &want, "step {}: {:?}", i, s);
                }
            }
        }
        for (k, v) in &model {
            prop_assert_eq!(tree.get_u64(*k).await.unwrap(), Some(*v));
        }
        Ok(model)
    })?;
    let (_, keys) = checked_keys(&t, "oracle");
    prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>(), "the tree holds exactly the model's keys");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn from_an_empty_tree(steps in prop::collection::vec(step(300), 1..600)) {
        check(0, &steps, "none")?;
    }

    #[test]
    fn from_a_bulk_loaded_tree(steps in prop::collection::vec(step(3000), 1..400)) {
        check(3000, &steps, "none")?;
    }

    #[test]
    fn with_speculative_lookup(steps in prop::collection::vec(step(200), 1..600)) {
        check(500, &steps, "spec-lookup")?;
    }
}
