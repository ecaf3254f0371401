//! What has been declared on a connection, remembered in declaration order and re-declared on
//! every new link.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::transport::Channel;

use super::calls::{bind_on, declare_exchange_on, declare_queue_on};
use super::spec::{Binding, ExchangeSpec, QueueSpec};
use crate::connection::Link;
use crate::error::{Error, Result};
use crate::observe::{ConnectionEvent, Observer};

/// What has been declared on a connection, in declaration order.
#[derive(Default)]
pub(crate) struct Topology {
    pub(super) exchanges: Vec<ExchangeSpec>,
    pub(super) queues: Vec<QueueSpec>,
    pub(super) bindings: Vec<Binding>,
}

pub(super) fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    match list.iter_mut().find(|x| same(x)) {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

/// Re-declares everything remembered on a fresh link (the supervisor calls this after a
/// reconnect). A failure is reported to the observer and the rest goes on.
///
/// An exclusive queue the broker still counts as the lost connection's is refused (405
/// RESOURCE_LOCKED) until the broker lets that connection go — at once when it saw the socket
/// close, at its heartbeat timeout when it did not — and deletes the queue: its declaration is
/// tried again, with pauses, for up to [`held_for`]`(heartbeat)`, or the queue would be gone for
/// good once the broker let go.
pub(crate) fn redeclare(
    topology: &Mutex<Topology>,
    observer: &dyn Observer,
    link: &Link,
    heartbeat: Duration,
) {
    let (exchanges, queues, bindings) = {
        let t = topology.lock();
        (t.exchanges.clone(), t.queues.clone(), t.bindings.clone())
    };
    let mut channel: Option<Channel> = None;
    let report = |what: String, e: Error| {
        let reason = e.to_string();
        observer.connection(&ConnectionEvent::RedeclareFailed {
            what: &what,
            reason: &reason,
        });
    };
    for e in &exchanges {
        if let Err(err) = on_channel(&mut channel, link, |c| declare_exchange_on(c, e)) {
            report(format!("exchange {:?}", e.name), err);
        }
    }
    for q in &queues {
        let declare = |channel: &mut Option<Channel>| {
            on_channel(channel, link, |c| declare_queue_on(c, q).map(|_| ()))
        };
        let mut result = declare(&mut channel);
        if q.exclusive {
            let deadline = Instant::now() + held_for(heartbeat);
            let mut pause = Duration::from_millis(50);
            while result.as_ref().is_err_and(is_locked) && Instant::now() < deadline {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_secs(1));
                result = declare(&mut channel);
            }
        }
        if let Err(err) = result {
            report(format!("queue {:?}", q.name), err);
        }
    }
    for b in &bindings {
        if let Err(err) = on_channel(&mut channel, link, |c| bind_on(c, b)) {
            report(
                format!(
                    "binding {:?} -> {:?} ({:?})",
                    b.exchange, b.queue, b.routing_key
                ),
                err,
            );
        }
    }
    if let Some(c) = channel {
        let _ = c.close();
    }
}

/// How long a lost connection may still hold its exclusive queues on the broker: two
/// heartbeats (after which the broker gives a silent peer up) and a margin; 30 s without
/// heartbeats.
pub(crate) fn held_for(heartbeat: Duration) -> Duration {
    if heartbeat.is_zero() {
        Duration::from_secs(30)
    } else {
        heartbeat * 2 + Duration::from_secs(5)
    }
}

/// 405 RESOURCE_LOCKED: an exclusive queue of another connection.
fn is_locked(e: &Error) -> bool {
    matches!(e, Error::Amqp { source, .. } if source.reply_code() == Some(405))
}

/// Runs `f` on `channel`, opening one on `link` first if there is none; a refusal closes the
/// channel, so after a failure the next call opens a new one.
fn on_channel(
    channel: &mut Option<Channel>,
    link: &Link,
    f: impl FnOnce(&Channel) -> Result<()>,
) -> Result<()> {
    let open = match channel {
        Some(c) => c,
        None => channel.insert(link.open_channel()?),
    };
    let result = f(open);
    if result.is_err() {
        *channel = None;
    }
    result
}
