//! SmallBank and TATP on ford-dtx: the transaction workloads of the Smart
//! paper's DTX experiments, with parallel loaders, per-type outcomes and an
//! audit.
//!
//! | module | what |
//! |---|---|
//! | [`smallbank`] | SmallBank: accounts in integer cents, six transactions, the ledger for the audit |
//! | [`tatp`] | TATP: five tables, NURand subscribers, seven transactions with inserts and deletes |
//! | [`workload`] | the run: create or open, recover, register, load, run, audit |

pub mod smallbank;
pub mod tatp;
pub mod workload;

pub use smallbank::SmallBank;
pub use tatp::Tatp;
pub use workload::{audit, parse_mix, run, Audited, Counts, DtxConfig, DtxReport, Workload, WorkloadError};
