//! The in-process broker behind `memory://name` (feature `memory`).

use std::sync::Arc;

use crossbeam_channel::Receiver;

use super::channel::Transport;
use super::wire::{AmqpError, Blocked};

/// A named in-process broker.
pub(crate) struct Broker;

/// Connects to the broker named `name` (created on first use).
pub(crate) fn connect(
    _name: &str,
    _connection_name: Option<&str>,
) -> Result<(Box<dyn Transport>, Receiver<Blocked>), AmqpError> {
    Err(AmqpError::ClientException)
}

/// The broker named `name` (created if none).
pub(crate) fn broker(_name: &str) -> Arc<Broker> {
    Arc::new(Broker)
}
