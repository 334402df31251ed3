//! What can go wrong building or reading a world (a scenario or world file, a genesis), said for
//! the operator or creator: the file, the object, the rule. Each error carries its cause in its
//! message, so it says all of itself however it is printed.

use std::fmt::Display;

/// An error of a world being built or read.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    /// The world, genesis or file breaks a rule (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// A file that could not be read or written.
    #[error("{doing}: {cause}")]
    Io { doing: String, cause: std::io::Error },
    /// Something that does not parse, decode, load or compile (a file, a genesis, a script, its
    /// physics), with what it was.
    #[error("{what}: {cause}")]
    Bad { what: String, cause: String },
    /// Writing into the data directory.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The node's config (another sim's validators).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// The world's results.
pub type Result<T, E = WorldError> = std::result::Result<T, E>;

/// Results whose error says what went wrong with `what` ([`WorldError::Bad`]).
pub trait Bad<T> {
    fn bad(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Display> Bad<T> for std::result::Result<T, E> {
    fn bad(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| WorldError::Bad { what: what(), cause: e.to_string() })
    }
}

/// `Err(WorldError::Invalid(..))` unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::world::error::WorldError::Invalid(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;
