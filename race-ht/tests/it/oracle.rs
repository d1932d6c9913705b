//! Operation sequences against a `BTreeMap` (the test kit's oracle), on
//! the embedded backend and over a real memory-blade server on TCP.

use proptest::prelude::*;
use race_ht::{RaceConfig, RaceHt, RaceStats};
use smart_core::smart::SmartConfig;
use smart_core::RuntimeConfig;
use smart_testkit::backends::{self, Backend};
use smart_testkit::oracle::{check_against_model, step, Step};

use crate::{small, tiny};

/// Runs `steps` on a fresh table of `shape` on `b`.
fn check(b: &Backend, steps: &[Step], spec: bool, shape: RaceConfig) -> Result<RaceStats, TestCaseError> {
    let smart = SmartConfig { spec_lookup: spec, ..SmartConfig::default() };
    let cfg = RuntimeConfig { smart, ..RuntimeConfig::default() };
    check_against_model(&*b.transport, cfg, steps, move |ctx| async move {
        RaceHt::create(&ctx, "oracle", shape).await.unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn operation_sequences_match_a_btreemap(
        steps in prop::collection::vec(step(40), 1..400),
        spec in any::<bool>(),
        grow in any::<bool>(),
    ) {
        // `grow`: a one-group table that splits as keys arrive.
        check(&backends::embedded_sized(1, 16 << 20), &steps, spec, if grow { tiny() } else { small() })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn operation_sequences_over_tcp_match_a_btreemap(
        steps in prop::collection::vec(step(40), 1..300),
        spec in any::<bool>(),
    ) {
        // A real memory-blade server on loopback: the wire protocol, its
        // completions and its atomics under the same oracle.
        check(&backends::tcp_sized(1, 16 << 20), &steps, spec, tiny())?;
    }
}

fn long_sequence() -> Vec<Step> {
    smart_testkit::oracle::random_steps(11, 1, 20_000, 255).remove(0)
}

#[test]
fn a_long_seeded_sequence_matches_a_btreemap() {
    // One long sequence (20 000 steps) beyond what the proptest cases cover.
    let steps = long_sequence();
    for spec in [false, true] {
        check(&backends::embedded_sized(1, 16 << 20), &steps, spec, small()).unwrap();
        let st = check(&backends::embedded_sized(1, 16 << 20), &steps, spec, tiny()).unwrap();
        assert!(st.splits >= 8 && st.doublings >= 3, "the one-group table grew: {st:?}");
    }
}

#[test]
fn a_long_seeded_sequence_over_tcp_matches_a_btreemap() {
    let st = check(&backends::tcp_sized(2, 16 << 20), &long_sequence(), true, tiny()).unwrap();
    assert!(st.splits >= 8 && st.doublings >= 3, "the one-group table grew over two tcp blades: {st:?}");
}
