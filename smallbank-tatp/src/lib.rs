//! SmallBank and TATP on ford-dtx: the transaction workloads of the Smart
//! paper's DTX experiments, with parallel loaders, per-type outcomes and an
//! audit.
//!
//! | module | what |
//! |---|---|
//! | [`smallbank`] | SmallBank: accounts in integer cents, six transactions, the ledger for the audit |
//! | [`tatp`] | TATP: five tables, NURand subscribers, seven transactions with inserts and deletes |
//! | [`workload`] | the run: create or open, recover, register, load, run, audit |
//!
//! ## Example
//!
//! A short SmallBank run on two embedded blades (one replica of each table on
//! each), then the audit: money is conserved.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use smart_bench::harness::RunConfig;
//! use smart_core::{EmbeddedTransport, Transport};
//! use smallbank_tatp::{smallbank, DtxConfig, SmallBank};
//! let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(2, 32 << 20).unwrap());
//! let cfg = RunConfig {
//!     threads: 1,
//!     coroutines: 4,
//!     duration: Duration::from_millis(200),
//!     warmup: Duration::ZERO,
//!     ..RunConfig::default()
//! };
//! let bank = SmallBank { accounts: 1000, hot: 100, ledger: true, mix: smallbank::MIX };
//! let d = DtxConfig { db: "doc".into(), replicas: 2, retry_aborts: false, lease: Duration::from_secs(5), halt: None, fence_tag: None, fence_recorded: None, lost: vec![], joining: vec![], settle: vec![] };
//! let report = smallbank_tatp::run(t.clone(), &cfg, &bank, &d).unwrap();
//! assert!(report.counts.total_attempted() > 0);
//! let audit = smallbank_tatp::audit(&*t, &cfg, "doc", true).unwrap();
//! assert_eq!(audit.violations, 0);
//! assert_eq!(audit.balances, audit.expected);
//! ```

#![warn(missing_docs)]

pub mod smallbank;
pub mod tatp;
pub mod workload;

pub use smallbank::SmallBank;
pub use tatp::Tatp;
pub use workload::{audit, parse_mix, run, Audited, Counts, DtxConfig, DtxReport, Workload, WorkloadError};
