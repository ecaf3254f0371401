//! What has been declared on a connection, remembered in declaration order and re-declared on
//! every new link.

use parking_lot::Mutex;

use crate::transport::Channel;

use super::calls::{bind_on, declare_exchange_on, declare_queue_on};
use super::spec::{Binding, ExchangeSpec, QueueSpec};
use crate::connection::Link;
use crate::error::Result;
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
pub(crate) fn redeclare(topology: &Mutex<Topology>, observer: &dyn Observer, link: &Link) {
    let (exchanges, queues, bindings) = {
        let t = topology.lock();
        (t.exchanges.clone(), t.queues.clone(), t.bindings.clone())
    };
    let mut channel: Option<Channel> = None;
    let mut run = |what: String, f: &dyn Fn(&Channel) -> Result<()>| {
        if channel.is_none() {
            match link.open_channel() {
                Ok(c) => channel = Some(c),
                Err(e) => {
                    let reason = e.to_string();
                    observer.connection(&ConnectionEvent::RedeclareFailed {
                        what: &what,
                        reason: &reason,
                    });
                    return;
                }
            }
        }
        if let Some(c) = &channel {
            if let Err(e) = f(c) {
                let reason = e.to_string();
                observer.connection(&ConnectionEvent::RedeclareFailed {
                    what: &what,
                    reason: &reason,
                });
                // A refused declaration closes the channel: use a new one for the rest.
                channel = None;
            }
        }
    };
    for e in &exchanges {
        run(format!("exchange {:?}", e.name), &|c| {
            declare_exchange_on(c, e)
        });
    }
    for q in &queues {
        run(format!("queue {:?}", q.name), &|c| {
            declare_queue_on(c, q).map(|_| ())
        });
    }
    for b in &bindings {
        run(
            format!(
                "binding {:?} -> {:?} ({:?})",
                b.exchange, b.queue, b.routing_key
            ),
            &|c| bind_on(c, b),
        );
    }
    if let Some(c) = channel {
        let _ = c.close();
    }
}
