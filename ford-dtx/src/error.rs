//! Errors of the transaction layer, and why a transaction aborted.

use serde::Serialize;

/// Errors of the database (not aborts: see [`TxnError`]).
#[derive(Debug, thiserror::Error)]
pub enum DtxError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// The configuration or request cannot be served.
    #[error("{0}")]
    Config(String),
    /// The remote structure is not what this build expects.
    #[error("corrupt database: {0}")]
    Corrupt(String),
    /// This compute blade's lease may have expired (its heartbeat came late
    /// or failed): recovery may be repairing its transactions, so none may
    /// lock or commit any more.
    #[error("the compute blade's lease on the database may have expired: its transactions stop (run again; recovery repairs what it left)")]
    LeaseLost,
    /// Every registry slot is held.
    #[error("all {0} registry slots are held by live compute blades (or need recovery: run `compute-blade recover`)")]
    RegistryFull(u64),
}

/// Result with [`DtxError`].
pub type Result<T, E = DtxError> = std::result::Result<T, E>;

/// Why a transaction aborted (it released every lock it held first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Abort {
    /// A lock it needed was held by another transaction.
    Locked,
    /// Validation found a read item changed or locked.
    Validation,
    /// A record was read while being written (its CRC failed).
    Torn,
    /// A key it reads, updates or deletes does not exist (FORD aborts; the
    /// workloads count these apart from conflicts).
    NotFound,
    /// A key it inserts exists already.
    Exists,
    /// The application decided (e.g. SmallBank's SendPayment with too little
    /// money).
    User,
}

impl Abort {
    /// Every cause, in report order.
    pub const ALL: [Abort; 6] =
        [Abort::Locked, Abort::Validation, Abort::Torn, Abort::NotFound, Abort::Exists, Abort::User];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Abort::Locked => "locked",
            Abort::Validation => "validation",
            Abort::Torn => "torn",
            Abort::NotFound => "not_found",
            Abort::Exists => "exists",
            Abort::User => "user",
        }
    }

    /// Whether retrying the same transaction may succeed (a conflict), as
    /// opposed to an outcome of the data.
    pub fn is_conflict(self) -> bool {
        matches!(self, Abort::Locked | Abort::Validation | Abort::Torn)
    }
}

/// How a transaction failed.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// It aborted, holding no lock.
    #[error("aborted: {}", .0.name())]
    Abort(Abort),
    /// The database failed; locks may be left for recovery.
    #[error(transparent)]
    Dtx(#[from] DtxError),
}

impl From<smart_core::Error> for TxnError {
    fn from(e: smart_core::Error) -> Self {
        TxnError::Dtx(DtxError::Verbs(e))
    }
}
