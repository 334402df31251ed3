//! The Metatopia client (DESIGN §12): the protocol clients and nodes speak ([`proto`]), QUIC
//! with the node's key pinned ([`quic`]), the client library ([`Client`]), account keys
//! ([`keys`]), the terminal client ([`tui`]) and load-generating bots ([`bots`]).
//!
//! The node's `metatopia client` and `metatopia bot` commands are thin shells over this crate;
//! the node also uses [`proto`] for its client service, so the web viewer's WebSocket gateway and
//! the QUIC service speak exactly the same messages.

pub mod bots;
pub mod conn;
pub mod error;
pub mod fork;
pub mod keys;
pub mod nearest;
pub mod proto;
pub mod quic;
pub mod tui;

pub use conn::{ActError, Client, View};
pub use error::ClientError;
