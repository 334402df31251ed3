//! The client library's connection errors.

use std::time::Duration;

/// Why the client could not reach or hear a node.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("not connected")]
    NotConnected,
    #[error("{0}")]
    Address(String),
    #[error("the node's key: {0}")]
    Key(String),
    #[error("setting up QUIC: {0}")]
    Quic(String),
    #[error("opening a UDP socket for QUIC: {0}")]
    Socket(#[source] std::io::Error),
    #[error("{node}: no answer within {wait:?}")]
    NoAnswer { node: String, wait: Duration },
    #[error("connecting to {node}: {reason}")]
    Connect { node: String, reason: String },
    #[error("sending to {node}: {source}")]
    Send { node: String, source: std::io::Error },
    #[error("{node} closed the connection")]
    Closed { node: String },
    /// The node answered with an error message.
    #[error("{node}: {message}")]
    Node { node: String, message: String },
    /// No node to go to.
    #[error("{0}")]
    NoNode(String),
}
