//! The error type of smart-core.

use crate::layout::LayoutError;
use crate::verbs::WcStatus;

/// Everything that can go wrong in smart-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A work request completed with an error; the batch's earlier WRs took
    /// effect, this one and the later ones did not.
    #[error("work request {index} of the batch failed: {status}")]
    Wc {
        /// The completion status.
        status: WcStatus,
        /// Index of the failing WR in its batch.
        index: u16,
    },
    /// An I/O error on the connection to a memory blade.
    #[error("memory blade {peer}: {cause}")]
    Io {
        /// The blade's address.
        peer: String,
        /// The cause (in the message, so not repeated as a source).
        cause: std::io::Error,
    },
    /// The peer is not a compatible memory blade.
    #[error("handshake with memory blade {peer} failed: {reason}")]
    Handshake {
        /// The blade's address.
        peer: String,
        /// Why.
        reason: String,
    },
    /// A blade's superblock is missing or incompatible.
    #[error("memory blade {blade}: {cause}")]
    Layout {
        /// Which blade.
        blade: u16,
        /// The cause.
        cause: LayoutError,
    },
    /// A batch needs more WRs or local bytes than a slot holds.
    /// A batch got no completion within the request time-out.
    #[error(
        "memory blade {blade} did not answer a batch within {waited_ms} ms (frozen, overloaded or unreachable; \
         the limit is RuntimeConfig::request_timeout, --request-timeout)"
    )]
    Timeout {
        /// The blade (QP) it was posted to.
        blade: u16,
        /// How long it had waited, in ms.
        waited_ms: u64,
    },
    /// A batch or connection to a blade that timed out earlier and has sent
    /// nothing since: not waited for again (see
    /// [`Silence`](crate::backend::Silence)).
    #[error(
        "memory blade {blade} did not answer a batch within {waited_ms} ms and has sent nothing since (frozen, \
         overloaded or unreachable; the limit is RuntimeConfig::request_timeout, --request-timeout)"
    )]
    Silent {
        /// The blade.
        blade: u16,
        /// How long the batch that found it silent waited, in ms.
        waited_ms: u64,
    },
    /// A worker thread panicked (a bug): its run was stopped and every
    /// other thread joined.
    #[error("a worker thread panicked: {0}")]
    WorkerPanicked(String),
    /// A batch does not fit: too many WRs, or more local bytes than a slot holds.
    #[error("batch too large: {what} (raise RuntimeConfig::{knob})")]
    BatchTooLarge {
        /// What overflowed.
        what: String,
        /// The configuration value that bounds it.
        knob: &'static str,
    },
    /// A WR named a blade that this transport does not reach.
    #[error("no memory blade {0} (the transport has {1})")]
    NoSuchBlade(u16, usize),
    /// One batch named two blades; a batch goes to one QP, hence one blade.
    #[error("a batch must target one memory blade, got {0} and {1}")]
    BatchSpansBlades(u16, u16),
    /// The blade's heap is exhausted.
    #[error(
        "memory blade {blade} is out of memory: asked {bytes} bytes, more than is left of the heap of a \
         {size}-byte blade (start it with a larger --size, or a larger --blade-size for embedded blades)"
    )]
    OutOfMemory {
        /// Which blade.
        blade: u16,
        /// Bytes asked for.
        bytes: u64,
        /// The blade's size.
        size: u64,
    },
    /// The named-root table is full.
    #[error("memory blade {0}: named-root table is full")]
    RootsFull(u16),
    /// A malformed work request (a bug in the caller).
    #[error("invalid work request: {0}")]
    InvalidWr(&'static str),
    /// An operation that needs an idle QP found work in flight.
    #[error("queue pair to blade {0} still has work requests in flight")]
    QpBusy(u16),
    /// The requested backend or feature is not available.
    #[error("{0}")]
    Unsupported(String),
    /// A blade holds what this build never wrote there (a damaged backing
    /// file, a stray writer): found where it was read, and named.
    #[error("memory blade {blade} is damaged: {what}")]
    Damaged {
        /// Which blade.
        blade: u16,
        /// What was read, and why it cannot be right.
        what: String,
    },
    /// The run's blades are not, in this order, the set they were when
    /// first used together ([`crate::Ctx::check_blade_set`]).
    #[error("memory blade {blade} {what}")]
    BladeSet {
        /// Which blade (its index in the run's list).
        blade: u16,
        /// What it was instead, and what that means.
        what: String,
    },
    /// Not every party arrived at a barrier in time.
    #[error(
        "barrier {name:?}: {arrived} of {parties} processes arrived within {waited_ms} ms (a compute blade did not \
         start, died before arriving, or used another party count)"
    )]
    BarrierTimeout {
        /// The barrier's name.
        name: String,
        /// Parties of this generation that had arrived.
        arrived: u64,
        /// Parties expected.
        parties: u64,
        /// How long this one waited, in ms.
        waited_ms: u64,
    },
}

impl Error {
    /// Whether this is a completion error with the given status.
    pub fn is_wc(&self, status: WcStatus) -> bool {
        matches!(self, Error::Wc { status: s, .. } if *s == status)
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
