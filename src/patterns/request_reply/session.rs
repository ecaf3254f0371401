//! The `acemq-requester` thread: on each connection it declares and consumes the reply queue,
//! opens the request channel beside it and installs both as the live [`Session`]; then it
//! watches until the session ends — returned requests, the reply consumer's end, a closed
//! request channel, acknowledgements, late replies while no call waits — and declares a new one
//! after a reconnect.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::transport::{ConsumerMessage, ConsumerOptions as AmqpConsumerOptions, Feed, Return};
use crossbeam_channel::{Receiver, RecvError, Select, Sender};
use parking_lot::Mutex;

use super::calls::Inner;
use super::reply_queue::{ReplyAcks, Session};
use super::wire::REPLY_QUEUE_PREFIX;
use crate::connection::{declare_queue_on, Link, QueueSpec};
use crate::envelope::new_id;
use crate::error::{Error, Result};

/// What woke the requester thread, whichever came first.
#[allow(clippy::large_enum_variant)] // moved once, straight to its match: boxing would cost more
enum Wake {
    Stop,
    Returned(std::result::Result<Return, RecvError>),
    Ended(std::result::Result<u64, RecvError>),
    Ack,
    /// Nothing within the idle wait.
    Idle,
}

fn wake(
    stop: &Receiver<()>,
    returns: &Feed<Return>,
    ended: &Receiver<u64>,
    ack_woken: &Receiver<()>,
    idle: Duration,
) -> Wake {
    let mut select = Select::new();
    let on_stop = select.recv(stop);
    let on_return = returns.register(&mut select);
    let on_ended = select.recv(ended);
    let on_ack = select.recv(ack_woken);
    let Ok(op) = select.select_timeout(idle) else {
        return Wake::Idle;
    };
    match op.index() {
        i if i == on_stop => {
            let _ = op.recv(stop);
            Wake::Stop
        }
        i if i == on_return => Wake::Returned(returns.read(op)),
        i if i == on_ended => Wake::Ended(op.recv(ended)),
        i => {
            debug_assert_eq!(i, on_ack);
            let _ = op.recv(ack_woken);
            Wake::Ack
        }
    }
}

/// While no call waits, `acemq-requester` reads the reply queue itself this often.
const IDLE_READ: Duration = Duration::from_millis(100);

/// … and this soon again while it finds replies there (a backlog).
const BACKLOG_READ: Duration = Duration::from_millis(1);

impl Inner {
    /// While no call waits, reads what reached the reply queue (late replies), acknowledging
    /// on `channel` (the reply channel) as it goes. `None` when the reply consumer has ended,
    /// else how many it read.
    fn read_idle(
        &self,
        replies: &crate::transport::Deliveries,
        acks: &ReplyAcks,
        channel: &crate::transport::Channel,
    ) -> Option<usize> {
        let mut read = 0;
        let alive = loop {
            if !self.state.lock().pending.is_empty() {
                break true; // the calls read it
            }
            match replies.try_recv() {
                Ok(ConsumerMessage::Delivery(mut d)) => {
                    let reply = d.take_message();
                    if acks.took(d) {
                        acks.ack(channel);
                    }
                    read += 1;
                    self.deliver(reply)
                }
                Ok(_) | Err(crossbeam_channel::TryRecvError::Disconnected) => break false,
                Err(crossbeam_channel::TryRecvError::Empty) => break true,
            }
        };
        acks.ack(channel);
        alive.then_some(read)
    }

    /// The reply queue to declare: the named one, else a new transient `acemq-reply-<id>`.
    fn reply_spec(&self) -> QueueSpec {
        match &self.reply_queue {
            Some(name) => QueueSpec::new(name.clone()),
            None => QueueSpec::new(format!("{REPLY_QUEUE_PREFIX}{}", new_id()))
                .durable(false)
                .exclusive(true)
                .auto_delete(true)
                .classic(),
        }
    }
}

/// How a session ended.
enum Ended {
    /// The requester is closing.
    Stopped,
    /// The reply consumer ended (the connection dropped, the queue was deleted).
    Replies,
    /// The broker closed the request channel (a publish to a missing exchange), with its reason.
    Requests(Option<(u16, String)>),
}

/// The `acemq-requester` thread: (re)declares and consumes the reply queue on each connection,
/// opens the request channel beside it, and fails calls whose requests come back unroutable.
pub(super) fn reply_loop(
    inner: &Inner,
    stop: &Receiver<()>,
    ended: &Receiver<u64>,
    started: Sender<Result<()>>,
) {
    let mut started = Some(started);
    let fail_start = |started: &mut Option<Sender<Result<()>>>, e: Error| {
        if let Some(tx) = started.take() {
            let _ = tx.send(Err(e));
            true
        } else {
            false
        }
    };
    let mut number = 0u64;
    loop {
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let link = match inner.connection.link(Duration::from_millis(250)) {
            Ok(link) => link,
            Err(e @ Error::Closed { .. }) => {
                if !fail_start(&mut started, e) {
                    inner.close_state(|| Error::Closed { what: "connection" });
                }
                return;
            }
            Err(e) => {
                if fail_start(&mut started, e) {
                    return;
                }
                continue;
            }
        };
        number += 1;
        let how = match run_session(inner, &link, number, stop, ended, &mut started) {
            Ok(how) => how,
            Err(e) => {
                if fail_start(&mut started, e) {
                    return;
                }
                log::warn!("acemq: the requester could not set up its reply queue; retrying");
                if stop.recv_timeout(Duration::from_millis(200)).is_ok() {
                    return;
                }
                continue;
            }
        };
        match how {
            Ended::Stopped => return,
            Ended::Replies => log::warn!(
                "acemq: the requester lost its reply queue (connection lost or queue deleted); \
                 declaring a new one"
            ),
            Ended::Requests(reason) => log::warn!(
                "acemq: the broker closed the requester's request channel ({}); opening a new one",
                reason.map_or_else(|| "no reason given".into(), |(c, t)| format!("{c} {t}"))
            ),
        }
    }
}

/// One session: declare and consume the reply queue, open the request channel, install them
/// for the calls, then watch until the session ends.
fn run_session(
    inner: &Inner,
    link: &Link,
    number: u64,
    stop: &Receiver<()>,
    ended: &Receiver<u64>,
    started: &mut Option<Sender<Result<()>>>,
) -> Result<Ended> {
    let spec = inner.reply_spec();
    let channel = link.open_channel()?;
    declare_queue_on(&channel, &spec)?;
    let requests = link.open_channel()?;
    let returns = requests
        .listen_for_returns()
        .map_err(|e| Error::amqp("listening for returned requests", e))?;
    // Acknowledged, with a prefetch: a backlog stays in the broker (see the module docs).
    let prefetch = u16::try_from(inner.window.saturating_mul(2)).unwrap_or(u16::MAX);
    channel
        .qos(0, prefetch, false)
        .map_err(|e| Error::amqp("setting the reply consumer's prefetch", e))?;
    let acks = Arc::new(ReplyAcks::new(prefetch));
    let options = AmqpConsumerOptions {
        no_ack: false,
        exclusive: true,
        ..AmqpConsumerOptions::default()
    };
    let consumer = channel
        .basic_consume(spec.name.clone(), options)
        .map_err(|e| Error::from_amqp_on("queue", &spec.name, "consuming from", e))?;
    let requests = Arc::new(Mutex::new(Some(requests)));
    inner.state.lock().session = Some(Session {
        number,
        queue: spec.name.clone(),
        requests: requests.clone(),
        replies: consumer.receiver().clone(),
        acks: acks.clone(),
    });
    inner.ready.notify_all();
    if let Some(tx) = started.take() {
        let _ = tx.send(Ok(()));
    }
    // While a backlog is being read, the next idle read comes soon.
    let mut idle = IDLE_READ;
    let how = loop {
        match wake(stop, &returns, ended, &inner.ack_woken, idle) {
            Wake::Stop => break Ended::Stopped,
            Wake::Returned(Ok(r)) => inner.returned(r),
            Wake::Returned(Err(_)) => break Ended::Requests(closed_reason(&requests)),
            Wake::Ended(n) => {
                if n == Ok(number) {
                    break Ended::Replies;
                }
            }
            Wake::Ack => {
                acks.ack(&channel);
                inner.release_parked();
            }
            Wake::Idle => match inner.read_idle(consumer.receiver(), &acks, &channel) {
                Some(read) => {
                    inner.release_parked();
                    idle = if read > 0 { BACKLOG_READ } else { IDLE_READ };
                }
                None => break Ended::Replies,
            },
        }
    };
    match &how {
        Ended::Stopped => {}
        Ended::Replies => {
            inner.lose_session(|| Error::ConnectionLost {
                context: "waiting for a reply (the reply queue went with the connection)".into(),
            });
        }
        Ended::Requests(reason) => {
            let exchange = &inner.exchange;
            inner.lose_session(|| match reason {
                Some((404, text)) if text.contains(&format!("exchange '{exchange}'")) => {
                    Error::NotFound {
                        kind: "exchange",
                        name: exchange.clone(),
                        reason: text.clone(),
                    }
                }
                Some((code, text)) => Error::ConnectionLost {
                    context: format!(
                        "waiting for a reply: the broker closed the request channel ({code} {text})"
                    ),
                },
                None => Error::ConnectionLost {
                    context: "waiting for a reply: the request channel closed".into(),
                },
            });
        }
    }
    crate::consume::cancel_and_drain(&spec.name, &consumer, |mut d| {
        let reply = d.take_message();
        acks.took(d);
        inner.deliver(reply)
    });
    // What was read is not handed back to the queue (a named one would deliver it again).
    acks.ack(&channel);
    drop(consumer);
    let _ = channel.close();
    if let Some(requests) = requests.lock().take() {
        let _ = requests.close();
    }
    Ok(how)
}

/// The broker's reason for closing the request channel: amiquip reports it on the channel's
/// next call.
fn closed_reason(requests: &Mutex<Option<crate::transport::Channel>>) -> Option<(u16, String)> {
    match requests.lock().take()?.close() {
        Err(crate::transport::AmqpError::ServerClosedChannel { code, message, .. }) => {
            Some((code, message))
        }
        _ => None,
    }
}
