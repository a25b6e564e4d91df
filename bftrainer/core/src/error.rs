//! The one error type of bftrainer-core's engine, parsers and simulator: every variant
//! says what was wrong and where (file and line for inputs, simulated time for the engine).

/// Everything that can go wrong in the pure engine, the trace parsers and the simulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed input line: `what` names the input (file name or a description).
    #[error("{what}:{line}: {msg}")]
    Parse {
        what: String,
        line: u64,
        msg: String,
    },
    /// The reader failed, e.g. a truncated gzip stream; `line` is the last line read.
    /// The cause is part of the message (not a `source`), so that it is printed once.
    #[error("{what}: read failed after line {line}: line {} is cut short or unreadable (a truncated or damaged file?): {cause}", .line + 1)]
    Read {
        what: String,
        line: u64,
        cause: std::io::Error,
    },
    /// An input could not be opened (again: streaming replays read their input in passes).
    #[error("cannot open {what}: {cause}")]
    Open { what: String, cause: std::io::Error },
    /// Sorting an input out of time order in a temporary file failed (no room, or no
    /// writable temporary directory).
    #[error("{what}: sorting in a temporary file failed (it needs a writable $TMPDIR, else /tmp, with room for a copy of the records): {cause}")]
    Spill { what: String, cause: std::io::Error },
    /// An input read while the replay runs failed (e.g. slurmdbd stopped answering).
    #[error("{what}: {msg}")]
    Input { what: String, msg: String },
    /// An option out of range or inputs that do not fit together.
    #[error("invalid setting: {0}")]
    Config(String),
    /// An event the engine cannot apply (unknown node or job, impossible transition).
    #[error("engine at t={t}: {msg}")]
    Engine { t: f64, msg: String },
    /// The allocator failed or returned a decision that breaks its contract.
    #[error("allocator at t={t}: {msg}")]
    Alloc { t: f64, msg: String },
    /// The simulator's invariant checker found a violation: a bug, never bad input.
    #[error("invariant violated at t={t}: {msg}")]
    Invariant { t: f64, msg: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
