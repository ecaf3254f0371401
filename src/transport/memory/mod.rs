//! The in-process broker behind `memory://name` (feature `memory`): an AMQP 0-9-1 broker in
//! the process, deliberately not more forgiving than the RabbitMQ it follows — 4.x by default,
//! 3.10 when `testing::MemoryBroker::rabbitmq_major(3)` asks (`State::major`): the quorum
//! queues' delivery limit and `x-delivery-count`, where a returned message goes, how `x-death`
//! is counted and `x-last-death-*`, `x-queue-type` kept among a queue's arguments. Each name is
//! its own broker, shared by every connection to that name and kept for the life of the process.
//!
//! * `broker`: the state under one lock per broker (connections, channels, unacked messages);
//! * `routing`: exchanges (default, direct, fanout, topic, headers and the `amq.*` ones);
//! * `queue`: queues, their arguments and declare equivalence, ready messages, returns (the
//!   delivery limit) and expiry;
//! * `dead_letter`: `x-death` as RabbitMQ 4.x or 3.10 writes it, cycles dropped;
//! * `publish`: routing a publish, returns before confirms, a memory alarm's held publishes;
//! * `channel`: the seam's `Transport`, `ChannelApi` and `ConsumerApi`;
//! * `consumer`: dispatch (round robin, prefetch), cancel, channel and connection ends;
//! * `clock`: the broker clock and its `acemq-memory-clock` thread;
//! * `faults`: what the testing helper asks for (cuts, refusals, nacks, alarms, holds);
//! * `reply`: RabbitMQ's reply codes and texts.
// The faults (and what they use) are called by `testing::MemoryBroker` only: a build with
// `memory` and without `testing` carries them unused.
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

mod broker;
mod channel;
mod clock;
mod consumer;
mod dead_letter;
mod faults;
mod publish;
mod queue;
mod reply;
mod routing;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_quorum;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use crate::transport::{AmqpError, Blocked, Feed, Transport};

pub(crate) use state::Broker;

/// Every broker of the process, by name.
static REGISTRY: LazyLock<Mutex<HashMap<String, Arc<Broker>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The broker named `name` (created if none), for the testing helper's faults.
pub(crate) fn broker(name: &str) -> Arc<Broker> {
    let mut registry = REGISTRY.lock();
    registry
        .entry(name.to_string())
        .or_insert_with(|| Arc::new(Broker::new(name)))
        .clone()
}

/// A broker's name (what follows `memory://`): letters, digits, `.`, `_` and `-`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it needs a broker name, as in memory://orders-test".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{c:?} in {name:?}: a broker name is letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Connects to the broker named `name` (created on first use). The receiver gets
/// `Blocked::Blocked(reason)` / `Blocked::Unblocked` and disconnects when the connection ends
/// (cut or closed): the supervisor watches it exactly as it watches amiquip's.
pub(crate) fn connect(
    name: &str,
    connection_name: Option<&str>,
) -> Result<(Box<dyn Transport>, Feed<Blocked>), AmqpError> {
    let broker = broker(name);
    let (conn, blocked) = broker.open_connection(connection_name)?;
    Ok((
        Box::new(channel::MemoryTransport::new(broker, conn)),
        Feed::new(blocked),
    ))
}
