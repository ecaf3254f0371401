//! The calls waiting for their replies: the map of waiting calls beside the live session, under
//! one lock ([`Inner`]), and a call's life — registered, its request's bytes reserved, published,
//! its reply read (by itself, or handed over by another call or `acemq-requester`), forgotten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::transport::{ConsumerMessage, Deliveries, Publish, Return};
use crossbeam_channel::{Receiver, Select, Sender};
use parking_lot::{Condvar, Mutex};

use super::reply_queue::Session;
use super::wire::{answer, returned_header};
use crate::connection::Connection;
use crate::connection::{ByteBudget, Reservation};
use crate::envelope::{headers, new_id, HeaderValue, Message};
use crate::error::{Error, Result};
use crate::observe::{Observer, PublishOutcome};
use crate::publish::{blocked_or, check_fits, send_unconfirmed};

/// What a call waits for: its reply, or why none will come.
pub(super) type ReplySlot = Sender<Result<Message>>;

/// The live session and the calls waiting on it, under one lock so that a call never registers
/// on a queue that is already gone.
pub(super) struct State {
    /// `None` while (re)connecting.
    pub(super) session: Option<Session>,
    pub(super) pending: HashMap<String, ReplySlot>,
    /// Set when the requester or its connection is closed.
    pub(super) closed: bool,
}

/// What a requester's calls and `acemq-requester` share.
pub(super) struct Inner {
    pub(super) connection: Connection,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    /// The most calls waiting at once (`RequesterOptions::window`).
    pub(super) window: usize,
    /// A named reply queue (`RequesterOptions::reply_queue`).
    pub(super) reply_queue: Option<String>,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) state: Mutex<State>,
    /// Signalled when a session is installed, a call leaves, or the requester closes.
    pub(super) ready: Condvar,
    /// A call saw the reply consumer of this session end: `acemq-requester` replaces it.
    pub(super) ended: Sender<u64>,
    /// Calls took half the prefetch of replies: `acemq-requester` acknowledges them.
    pub(super) ack_wake: Sender<()>,
    pub(super) ack_woken: Receiver<()>,
    /// The bytes of requests whose calls ended without their reply while the broker blocked
    /// publishing: they may still be in amiquip's buffer, so they stay reserved until the broker
    /// unblocks (released by `acemq-requester`).
    pub(super) parked: Mutex<Vec<Reservation>>,
    pub(super) stopping: AtomicBool,
    pub(super) timed_out: AtomicU64,
    pub(super) unmatched: AtomicU64,
}

impl Inner {
    /// One call: registers it, reserves its request's bytes, publishes the request and waits
    /// up to `timeout` from `start` for its reply.
    pub(super) fn round_trip(
        &self,
        mut message: Message,
        start: Instant,
        timeout: Duration,
    ) -> Result<Message> {
        let inner = self;
        let deadline = start + timeout;
        let correlation = new_id();
        message.envelope.correlation_id = Some(correlation.clone());
        // Checked before the call waits for a session (not in `publish::prepare`, after it):
        // bad input fails at once, also while the requester reconnects.
        message.validate()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let session = inner.register(&correlation, tx, deadline, timeout)?;
        // The request's bytes, from the connection's budget like every publish's (the module
        // docs say when they are given back).
        let budget = inner.connection.budget();
        let Some(bytes) = budget.reserve(ByteBudget::size_of(&message), deadline) else {
            inner.forget(&correlation);
            let e = Error::Timeout {
                what: "room among the connection's unconfirmed bytes for the request (the \
                       broker is not reading them: blocked, or a stalled connection)"
                    .into(),
                after: timeout,
            };
            return Err(blocked_or(&inner.connection.shared.blocked, e));
        };
        let result = self.send_and_wait(message, &correlation, session, rx, deadline, timeout);
        inner.give_back(bytes, &result);
        result
    }

    /// Publishes the registered call's request on `session` and waits for its reply.
    fn send_and_wait(
        &self,
        mut message: Message,
        correlation: &str,
        session: Session,
        rx: Receiver<Result<Message>>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Message> {
        let inner = self;
        message.headers.insert(
            headers::REPLY_TO.to_string(),
            HeaderValue::Text(session.queue.clone()),
        );
        message.reply_to = Some(session.queue.clone());
        // The exchange and routing key were checked when the requester opened; the reply
        // address is the requester's own queue.
        let _ = crate::trace::stamp(&mut message, &inner.exchange, &inner.routing_key);
        let properties = message.to_properties(&inner.routing_key, Some(inner.connection.origin()));
        // A header frame over the limit would make the broker close the whole connection:
        // refused here, before anything is sent, and the call forgotten.
        if let Err(e) = check_fits(&properties, inner.connection.frame_max()) {
            inner.forget(correlation);
            return Err(e);
        }
        let publish = Publish {
            body: &message.body,
            routing_key: inner.routing_key.clone(),
            mandatory: true,
            properties,
        };
        // Requests go out one at a time on the request channel; the wait for it has the call's
        // deadline.
        let published = match session.requests.try_lock_until(deadline) {
            Some(requests) => match requests.as_ref() {
                Some(channel) => {
                    send_unconfirmed(channel, &inner.exchange, publish, &*inner.observer)
                        .map_err(|e| Error::amqp("publishing a request", e))
                }
                None => Err(Error::ConnectionLost {
                    context: "publishing a request (the requester is reconnecting)".into(),
                }),
            },
            None => Err(blocked_or(
                &inner.connection.shared.blocked,
                Error::Timeout {
                    what: "the request channel (a request before this one is still being \
                           handed over: the broker is not reading?)"
                        .into(),
                    after: timeout,
                },
            )),
        };
        if let Err(e) = published {
            if inner.forget(correlation) {
                return Err(e);
            }
            // `acemq-requester` already answered the call (the channel closed under it).
        }
        // Wait on our own slot and, meanwhile, read the reply queue: the reply usually comes
        // straight to this thread.
        let mut replies = session.replies;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut select = Select::new();
            let on_slot = select.recv(&rx);
            let on_reply = replies.register(&mut select);
            let Ok(op) = select.select_timeout(left) else {
                if inner.forget(correlation) {
                    inner.timed_out.fetch_add(1, Ordering::Relaxed);
                    return Err(Error::RequestTimeout {
                        routing_key: inner.routing_key.clone(),
                        correlation_id: correlation.to_string(),
                        after: timeout,
                    });
                }
                // The reply (or the news of a lost connection) won the race.
                return match rx.try_recv() {
                    Ok(Ok(reply)) => answer(reply),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(Error::Closed { what: "requester" }),
                };
            };
            if op.index() == on_slot {
                return match op.recv(&rx) {
                    Ok(Ok(reply)) => answer(reply),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(Error::Closed { what: "requester" }),
                };
            }
            debug_assert_eq!(op.index(), on_reply);
            match replies.read(op) {
                Ok(ConsumerMessage::Delivery(mut d)) => {
                    let reply = d.take_message();
                    if session.acks.took(d) {
                        let _ = inner.ack_wake.try_send(());
                    }
                    // Ours (the usual case): straight back, once taken out of the map.
                    let mine = reply.envelope.correlation_id.as_deref() == Some(correlation);
                    if mine && inner.forget(correlation) {
                        return answer(reply);
                    }
                    inner.deliver(reply);
                }
                // The reply consumer ended (connection lost, queue deleted, closing):
                // `acemq-requester` answers every waiting call; wait for that.
                _ => {
                    let _ = inner.ended.try_send(session.number);
                    replies = Deliveries::never();
                }
            }
        }
    }

    /// Registers a call on the live session (waiting for one while recovering, and for room
    /// among the waiting calls) and returns the session.
    pub(super) fn register(
        &self,
        correlation: &str,
        tx: ReplySlot,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Session> {
        let mut state = self.state.lock();
        loop {
            if state.closed {
                return Err(Error::Closed { what: "requester" });
            }
            let room = state.pending.len() < self.window;
            if let (Some(session), true) = (&state.session, room) {
                let session = session.clone();
                state.pending.insert(correlation.to_string(), tx);
                return Ok(session);
            }
            if self.ready.wait_until(&mut state, deadline).timed_out() {
                return Err(if state.session.is_none() {
                    Error::ConnectionLost {
                        context: format!("waiting {timeout:?} for the requester's reply queue"),
                    }
                } else {
                    Error::Timeout {
                        what: format!("room among the requester's {} waiting calls", self.window),
                        after: timeout,
                    }
                });
            }
        }
    }

    /// A call ends: its request's bytes go back to the budget — unless it ended without its
    /// reply while the broker blocks publishing (the request may still be in amiquip's buffer),
    /// then once the broker unblocks.
    pub(super) fn give_back(&self, bytes: Reservation, result: &Result<Message>) {
        let unanswered = matches!(result, Err(Error::RequestTimeout { .. }));
        if unanswered && self.connection.is_blocked() {
            self.parked.lock().push(bytes);
        }
    }

    /// Releases the parked reservations once the broker no longer blocks publishing.
    pub(super) fn release_parked(&self) {
        if !self.connection.is_blocked() {
            let parked = std::mem::take(&mut *self.parked.lock());
            drop(parked);
        }
    }

    /// Forgets a call; true if it was still waiting.
    pub(super) fn forget(&self, correlation: &str) -> bool {
        let removed = self.state.lock().pending.remove(correlation);
        self.left(removed)
    }

    /// A call left the map: its slot, if it was there; a call waiting for room may go on.
    fn left(&self, slot: Option<ReplySlot>) -> bool {
        if slot.is_some() {
            self.ready.notify_one();
        }
        slot.is_some()
    }

    /// A reply arrived: to its call, or counted and dropped.
    pub(super) fn deliver(&self, reply: Message) {
        let correlation = reply.envelope.correlation_id.as_deref().unwrap_or_default();
        let slot = self.state.lock().pending.remove(correlation);
        match slot {
            Some(tx) => {
                let _ = tx.try_send(Ok(reply));
                self.left(Some(tx));
            }
            None => {
                self.unmatched.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "acemq: reply {} with correlation {correlation:?} matches no waiting request \
                     (late or unknown); dropped",
                    reply.id()
                );
            }
        }
    }

    /// The broker returned a request as unroutable: its call fails at once.
    pub(super) fn returned(&self, r: Return) {
        self.observer
            .publish_answered(&crate::observe::PublishEvent {
                exchange: &r.exchange,
                routing_key: &r.routing_key,
                outcome: PublishOutcome::Unroutable,
                duration: None,
            });
        let correlation = returned_header(&r, headers::CORRELATION);
        let slot = self.state.lock().pending.remove(&correlation);
        match slot {
            Some(tx) => {
                let _ = tx.try_send(Err(Error::Unroutable {
                    exchange: r.exchange,
                    routing_key: r.routing_key,
                    message_id: r.properties.message_id().clone().unwrap_or_default(),
                    reply_code: r.reply_code,
                    reply_text: r.reply_text,
                }));
                self.left(Some(tx));
            }
            None => log::debug!(
                "acemq: a returned request with correlation {correlation:?} matches no waiting \
                 call; dropped"
            ),
        }
    }

    /// The session is gone: every waiting call fails with `error`. Returns how many did.
    pub(super) fn lose_session(&self, error: impl Fn() -> Error) -> usize {
        let pending: Vec<ReplySlot> = {
            let mut state = self.state.lock();
            state.session = None;
            state.pending.drain().map(|(_, tx)| tx).collect()
        };
        let failed = pending.len();
        for tx in pending {
            let _ = tx.try_send(Err(error()));
        }
        self.ready.notify_all();
        failed
    }

    /// The requester (or its connection) is closed: every waiting call fails with `error`, and
    /// no call registers again. Returns how many calls were still waiting.
    pub(super) fn close_state(&self, error: impl Fn() -> Error) -> usize {
        self.state.lock().closed = true;
        self.lose_session(error)
    }
}
