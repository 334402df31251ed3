//! What can go wrong with a data directory, said for its operator: what was being done to which
//! file, and why.

use std::io;

use metatopia_client::keys::KeyError;

/// An error of the store (the data directory, its log, journal, snapshots and key).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file or directory operation failed (`doing`: what, on which path). The cause is part of
    /// the message (not a `source`), so each error says all of itself however it is printed.
    #[error("{doing}: {cause}")]
    Io { doing: String, cause: io::Error },
    /// The directory holds data this node cannot read (another format, a damaged marker).
    #[error("{0}")]
    Format(String),
    /// A record too big to be written.
    #[error("{what} is too big ({len} bytes)")]
    TooBig { what: &'static str, len: usize },
    /// The node key could not be read, made or written.
    #[error("the node key {path}: {cause}")]
    Key { path: String, cause: KeyError },
}

/// The store's results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// `io::Result`s with what was being done, lazily said.
pub trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, StoreError>;
}

impl<T> Doing<T> for io::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, StoreError> {
        self.map_err(|cause| StoreError::Io { doing: what(), cause })
    }
}
