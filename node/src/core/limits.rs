//! Sizes the node accepts (the sim's own limits are its settings).

/// Largest signed event accepted from a client.
pub const MAX_EVENT_BYTES: u32 = 96 * 1024;
/// Largest signed event in a block: a neighbour sim's mail may be larger than a client's event.
pub const MAX_BLOCK_EVENT_BYTES: u32 = metatopia_sim::links::MAX_MAIL_BYTES + 4096;
