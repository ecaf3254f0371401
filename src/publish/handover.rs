//! Handing a publish to the channel: validated and checked against the frame limit, its bytes
//! reserved, numbered under the state lock, handed to amiquip (waiting for room, recovery and
//! the channel with the caller's deadline); and the checks every other publish shares.

use std::sync::Arc;
use std::time::Instant;

use crate::transport::Publish;
use parking_lot::{Mutex, MutexGuard};

use super::frame::check_message_fits;
use super::publisher::Publisher;
use super::state::{channel_failure, fail_all, note_missing, Control, Current, Pending, State};
use crate::connection::Reservation;
use crate::envelope::{check_name, Message};
use crate::error::{Error, Result};
use crate::observe::{Observer, PublishEvent, PublishOutcome};
use crate::ticket::Ticket;

impl Publisher {
    pub(super) fn publish_deferred_inner(
        &self,
        exchange: &str,
        routing_key: &str,
        mut message: Message,
        mandatory: bool,
        answered: Vec<crate::intercept::AnswerListener>,
    ) -> Result<Ticket> {
        let started = Instant::now();
        let mut span = prepare(exchange, routing_key, &mut message)?;
        let connection = &self.inner.connection;
        let fits = check_message_fits(
            &message,
            routing_key,
            connection.origin(),
            connection.frame_max(),
        );
        if let Err(e) = fits {
            span.end(Err(&e));
            return Err(e);
        }
        if let Err(e) = self.not_missing(exchange, routing_key, started) {
            span.end(Err(&e));
            return Err(e);
        }
        let timeout = self.inner.options.timeout;
        let deadline = Instant::now() + timeout;
        let bytes = match self.reserve_bytes(&message, deadline) {
            Ok(bytes) => bytes,
            Err(e) => {
                let e = self.refused_if_blocked(exchange, routing_key, started, e);
                span.end(Err(&e));
                return Err(e);
            }
        };
        let (tx, rx) = oneshot::channel();
        let confirms = self.inner.options.confirms;
        // Unconfirmed: the caller is answered once the frames are handed over, below.
        let (reply, answer_now, answered) = if confirms {
            (Some(tx), None, answered)
        } else {
            (None, Some((tx, answered)), Vec::new())
        };
        let pending = Pending {
            _bytes: Some(bytes),
            message_id: message.envelope.id.clone(),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            started,
            returned: None,
            reply,
            answered,
        };
        if let Err(e) = self.hand_over(
            exchange,
            routing_key,
            &message,
            pending,
            mandatory,
            deadline,
        ) {
            let e = self.refused_if_blocked(exchange, routing_key, started, e);
            span.end(Err(&e));
            return Err(e);
        }
        if let Some((tx, answered)) = answer_now {
            self.inner.shared.observer.publish_answered(&PublishEvent {
                exchange,
                routing_key,
                outcome: PublishOutcome::Unconfirmed,
                duration: Some(started.elapsed()),
            });
            crate::intercept::tell_answered(answered, &Ok(()));
            let _ = tx.send(Ok(()));
        }
        Ok(Ticket {
            reply: rx,
            message_id: message.envelope.id,
            deadline,
            timeout,
            span,
            blocked: self.inner.connection.shared.blocked.clone(),
        })
    }

    /// Unconfirmed publishing: refuses a publish to an exchange the broker closed the channel
    /// over since the last publish to it ([`Error::NotFound`], once; see [`State::missing`]).
    fn not_missing(&self, exchange: &str, routing_key: &str, started: Instant) -> Result<()> {
        if self.inner.options.confirms {
            return Ok(());
        }
        let found = {
            let mut state = self.inner.shared.state.lock();
            match &state.missing {
                Some((name, _)) if name == exchange => state.missing.take(),
                _ => None,
            }
        };
        let Some((name, reason)) = found else {
            return Ok(());
        };
        self.inner.shared.observer.publish_answered(&PublishEvent {
            exchange,
            routing_key,
            outcome: PublishOutcome::Failed,
            duration: Some(started.elapsed()),
        });
        Err(Error::NotFound {
            kind: "exchange",
            name,
            reason,
        })
    }

    /// A publish that timed out before anything was written (no room among the unconfirmed
    /// bytes or in the window, no channel) while the broker blocks the connection: refused, as
    /// the family counts it (`refused`), and said so ([`Error::Blocked`]).
    fn refused_if_blocked(
        &self,
        exchange: &str,
        routing_key: &str,
        started: Instant,
        e: Error,
    ) -> Error {
        let e = crate::ticket::blocked_or(&self.inner.connection.shared.blocked, e);
        if matches!(e, Error::Blocked { .. }) {
            self.inner.shared.observer.publish_answered(&PublishEvent {
                exchange,
                routing_key,
                outcome: PublishOutcome::Refused,
                duration: Some(started.elapsed()),
            });
        }
        e
    }

    /// Reserves the message's bytes among the connection's unconfirmed bytes, waiting for room
    /// up to `deadline`.
    fn reserve_bytes(&self, message: &Message, deadline: Instant) -> Result<Reservation> {
        // The body and a generous allowance for the frame and header overhead.
        let size = message.body.len().saturating_add(4096);
        let budget = self.inner.connection.budget();
        if !self.inner.options.confirms {
            // Unconfirmed: room comes back with a round trip; ask for one before waiting.
            if let Some(bytes) = budget.reserve(size, Instant::now()) {
                return Ok(bytes);
            }
            self.inner.shared.kick();
        }
        budget
            .reserve(size, deadline)
            .ok_or_else(|| Error::Timeout {
                what: "room among the connection's unconfirmed bytes (the broker is not \
                       taking them: blocked, or a stalled connection)"
                    .into(),
                after: self.inner.options.timeout,
            })
    }

    /// Waits (up to `deadline`) for room in the window and for a channel, opening one when
    /// there is none; returns the locked state with a current channel.
    fn room_and_channel(&self, deadline: Instant) -> Result<MutexGuard<'_, State>> {
        let shared = &self.inner.shared;
        let mut state = shared.state.lock();
        loop {
            if state.closed {
                return Err(Error::Closed { what: "publisher" });
            }
            if state.pending.len() >= self.inner.options.window {
                if !self.inner.options.confirms {
                    shared.kick(); // room comes back with a round trip
                }
                if shared.room.wait_until(&mut state, deadline).timed_out() {
                    return Err(Error::Timeout {
                        what: "room in the publisher's window".into(),
                        after: self.inner.options.timeout,
                    });
                }
                continue;
            }
            if state.current.is_none() {
                drop(state);
                self.open_channel(deadline)?;
                state = shared.state.lock();
                continue;
            }
            return Ok(state);
        }
    }

    /// Numbers the message, hands its frames to amiquip and records it as pending. When the
    /// channel turns out to be gone (nothing was handed over), fails what was in flight on it
    /// and either reports (the broker closed the channel over this publish: a missing exchange)
    /// or tries again on a new channel until `deadline`.
    fn hand_over(
        &self,
        exchange: &str,
        routing_key: &str,
        message: &Message,
        pending: Pending,
        mandatory: bool,
        deadline: Instant,
    ) -> Result<()> {
        let shared = &self.inner.shared;
        let origin = Some(self.inner.connection.origin());
        let mut properties = Some(message.to_properties(routing_key, origin));
        let mut pending = Some(pending);
        let window = self.inner.options.window;
        loop {
            let (sender, epoch) = {
                let state = self.room_and_channel(deadline)?;
                match state.current.as_ref() {
                    Some(current) => (current.channel.clone(), state.epoch),
                    None => continue,
                }
            };
            // Publishes on one channel go out one at a time, in the order they are numbered.
            let Some(mut channel) = sender.try_lock_until(deadline) else {
                return Err(Error::Timeout {
                    what: "the publisher's channel (held by a publish before this one still \
                           being handed over or, without confirms, by a round trip to the \
                           broker: is the broker reading?)"
                        .into(),
                    after: self.inner.options.timeout,
                });
            };
            let (tag, first, half_full) = {
                let mut state = shared.state.lock();
                if state.closed {
                    return Err(Error::Closed { what: "publisher" });
                }
                let full = state.pending.len() >= window;
                let same = state.epoch == epoch && channel.is_some();
                match state.current.as_mut() {
                    Some(current) if same && !full => {
                        let tag = current.next_tag;
                        current.next_tag += 1;
                        if let Some(p) = pending.take() {
                            state.pending.insert(tag, p);
                        }
                        let outstanding = state.pending.len();
                        (
                            tag,
                            outstanding == 1,
                            outstanding.saturating_mul(2) >= window,
                        )
                    }
                    // Replaced, broken or full meanwhile: again from the top.
                    _ => continue,
                }
            };
            let publish = Publish {
                body: &message.body,
                routing_key: routing_key.to_string(),
                mandatory,
                properties: properties
                    .take()
                    .unwrap_or_else(|| message.to_properties(routing_key, origin)),
            };
            let sent = match channel.as_ref() {
                Some(c) => c.basic_publish(exchange, publish),
                None => Err(crate::transport::AmqpError::link_lost(
                    "the channel is gone",
                )),
            };
            let Err(e) = sent else {
                if !self.inner.options.confirms {
                    if half_full {
                        // Release what is outstanding before the window fills.
                        shared.kick();
                    } else if first {
                        shared.wake();
                    }
                }
                return Ok(());
            };
            // Nothing was handed over: the channel is gone. Learn why (outside the state lock:
            // amiquip reports the broker's reason on the channel's close), fail what was in
            // flight on it, and take this publish back to try again on a new channel. The
            // channel's lock is held until they are failed, so the confirm thread (which sees
            // the channel end too) never fails them first without the reason.
            let broken = channel.take();
            let failure = channel_failure(broken, e);
            let mut state = shared.state.lock();
            pending = state.pending.remove(&tag);
            if state.epoch == epoch {
                state.current = None;
                note_missing(&mut state, &failure);
                fail_all(&mut state, &shared.observer, |p| {
                    failure.error_for(&p.exchange)
                });
                shared.room.notify_all();
            }
            drop(state);
            drop(channel);
            if let err @ Error::NotFound { .. } = failure.error_for(exchange) {
                shared.observer.publish_answered(&PublishEvent {
                    exchange,
                    routing_key,
                    outcome: PublishOutcome::Failed,
                    duration: pending.as_ref().map(|p| p.started.elapsed()),
                });
                return Err(err);
            }
            if pending.is_none() || Instant::now() >= deadline {
                // (Without `pending`, it was failed already, by the confirm thread.)
                return Err(Error::ConnectionLost {
                    context: format!("publishing message {:?}", message.envelope.id),
                });
            }
        }
    }

    /// Opens a channel on the current link — in confirm mode unless the publisher publishes
    /// without confirms — and installs it, unless another caller got there first.
    fn open_channel(&self, deadline: Instant) -> Result<()> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let link = self.inner.connection.link(wait)?;
        let wait = deadline.saturating_duration_since(Instant::now());
        let channel = link.open_channel_within(wait)?;
        let confirm_mode = self.inner.options.confirms;
        let setup = || -> std::result::Result<_, crate::transport::AmqpError> {
            let returns = channel.listen_for_returns()?;
            if !confirm_mode {
                return Ok((crate::transport::Feed::never(), returns));
            }
            let confirms = channel.listen_for_publisher_confirms()?;
            channel.enable_publisher_confirms()?;
            Ok((confirms, returns))
        };
        let (confirms, returns) =
            setup().map_err(|e| Error::amqp("opening the publisher's channel", e))?;
        let shared = &self.inner.shared;
        let mut state = shared.state.lock();
        if state.closed {
            return Err(Error::Closed { what: "publisher" });
        }
        if state.current.is_some() {
            return Ok(()); // another caller installed one; ours is closed on drop
        }
        fail_all(&mut state, &shared.observer, |_| Error::ConnectionLost {
            context: "waiting for a publish confirm".into(),
        });
        state.epoch += 1;
        state.current = Some(Current {
            channel: Arc::new(Mutex::new(Some(channel))),
            next_tag: 1,
        });
        let _ = self.inner.control.send(Control::Channel {
            epoch: state.epoch,
            confirms,
            returns,
        });
        Ok(())
    }
}

/// Publishes on `channel` without a publisher confirm — a request (its reply is its
/// confirmation), a reply to a transient reply queue — and reports it to `observer` as
/// [`PublishOutcome::Unconfirmed`] (or [`Failed`](PublishOutcome::Failed)), as the
/// [`Publisher`] reports its own publishes; a return of it is reported where it is read.
pub(crate) fn send_unconfirmed(
    channel: &crate::transport::Channel,
    exchange: &str,
    publish: Publish<'_>,
    observer: &dyn Observer,
) -> std::result::Result<(), crate::transport::AmqpError> {
    let routing_key = publish.routing_key.clone();
    let sent = channel.basic_publish(exchange, publish);
    let outcome = match sent {
        Ok(()) => PublishOutcome::Unconfirmed,
        Err(_) => PublishOutcome::Failed,
    };
    observer.publish_answered(&PublishEvent {
        exchange,
        routing_key: &routing_key,
        outcome,
        duration: None,
    });
    sent
}

/// What every publish does before its frames are built: the names and headers checked, the
/// trace context stamped (with the `opentelemetry` feature, the `publish` span started).
pub(crate) fn prepare(
    exchange: &str,
    routing_key: &str,
    message: &mut Message,
) -> Result<crate::trace::PublishSpan> {
    check_name("exchange", exchange, true)?;
    check_name("routing key", routing_key, true)?;
    message.validate()?;
    Ok(crate::trace::stamp(message, exchange, routing_key))
}
