//! What a publisher's callers and its thread (confirms, or the unconfirmed publisher's flush)
//! share: the pending publishes by delivery tag, the current channel, and why a channel went
//! away.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::transport::{Confirm, Feed, Return};
use parking_lot::{Condvar, Mutex};

use crate::connection::Reservation;
use crate::error::{Error, Result};
use crate::observe::{Observer, PublishEvent, PublishOutcome};

/// What the publisher's thread and callers share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) room: Condvar,
    pub(super) observer: Arc<dyn Observer>,
    /// Unconfirmed publishing: asks the flush thread for a round trip now (a caller waits for
    /// room, or half the window is used). Bounded (1): a kick already queued is enough.
    pub(super) kick: crossbeam_channel::Sender<()>,
    /// Unconfirmed publishing: tells the flush thread, asleep while nothing was outstanding,
    /// that something is (it then waits its linger before a round trip). Bounded (1).
    pub(super) wake: crossbeam_channel::Sender<()>,
    /// Unconfirmed publishing: mandatory publishes the broker returned (`Publisher::unroutable`).
    pub(super) returned: AtomicU64,
}

impl Shared {
    /// Asks the flush thread (unconfirmed publishing) for a round trip, unless one is asked.
    pub(super) fn kick(&self) {
        let _ = self.kick.try_send(());
    }

    /// Tells the flush thread (unconfirmed publishing) that a publish is outstanding.
    pub(super) fn wake(&self) {
        let _ = self.wake.try_send(());
    }
}

pub(super) struct State {
    pub(super) current: Option<Current>,
    /// Bumped per channel; confirms from an older channel are ignored.
    pub(super) epoch: u64,
    pub(super) pending: BTreeMap<u64, Pending>,
    pub(super) closed: bool,
    /// Unconfirmed publishing: an exchange the broker said does not exist when it closed the
    /// channel over an unconfirmed publish to it (its caller answered already), and its
    /// reason: the next publish to that exchange is refused with it ([`Error::NotFound`]).
    pub(super) missing: Option<(String, String)>,
}

pub(super) struct Current {
    /// The channel, under a lock of its own: a publish is numbered under the state lock and
    /// handed to amiquip under this one alone (taken with the caller's deadline), so that
    /// `basic_publish` — which blocks, without a deadline, once amiquip's buffer is full —
    /// never holds up the confirm thread, [`Publisher::in_flight`] or [`Publisher::close`].
    pub(super) channel: Arc<Mutex<Option<crate::transport::Channel>>>,
    pub(super) next_tag: u64,
}

pub(super) struct Pending {
    /// Released (dropped) when the publish is answered or failed.
    pub(super) _bytes: Option<Reservation>,
    pub(super) message_id: String,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    /// When the call began (`acemq.publish.duration` runs from here to the answer).
    pub(super) started: std::time::Instant,
    pub(super) returned: Option<(u16, String)>,
    /// The caller's answer; `None` for an unconfirmed publish, answered when it was handed
    /// over (what is pending then is its place in the window and its bytes, until the broker
    /// is known to have read it).
    pub(super) reply: Option<oneshot::Sender<Result<()>>>,
    /// Publish interceptors' listeners for the answer.
    pub(super) answered: Vec<crate::intercept::AnswerListener>,
}

pub(super) enum Control {
    Channel {
        epoch: u64,
        confirms: Feed<Confirm>,
        returns: Feed<Return>,
    },
    Stop,
}

/// Why a channel went away: the broker's close code and reason, when the broker closed it.
pub(super) struct ChannelFailure {
    server: Option<(u16, String)>,
}

impl ChannelFailure {
    /// The error for a publish on a channel that went away. A publish to an exchange the broker
    /// said does not exist gets [`Error::NotFound`]; every other one was lost with the channel
    /// and may be tried again ([`Error::ConnectionLost`]).
    pub(super) fn error_for(&self, exchange: &str) -> Error {
        match &self.server {
            Some((404, reason)) if reason.contains(&format!("exchange '{exchange}'")) => {
                Error::NotFound {
                    kind: "exchange",
                    name: exchange.to_string(),
                    reason: reason.clone(),
                }
            }
            Some((code, reason)) => Error::ConnectionLost {
                context: format!(
                    "waiting for a publish confirm: the broker closed the channel ({code} {reason})"
                ),
            },
            None => Error::ConnectionLost {
                context: "waiting for a publish confirm".into(),
            },
        }
    }
}

/// Why the channel went away, from its error `e` or (amiquip reports the broker's reason on the
/// channel's next call) from closing `broken`. Never called under the state lock.
pub(super) fn channel_failure(
    broken: Option<crate::transport::Channel>,
    e: crate::transport::AmqpError,
) -> ChannelFailure {
    let server = |e: &crate::transport::AmqpError| match e {
        crate::transport::AmqpError::ServerClosedChannel { code, message, .. } => {
            Some((*code, message.clone()))
        }
        _ => None,
    };
    let mut found = server(&e);
    if found.is_none() {
        // amiquip reports the broker's reason on the channel's next call.
        if let Some(c) = broken {
            if let Err(e) = c.close() {
                found = server(&e);
            }
        }
    }
    ChannelFailure { server: found }
}

/// Before the publishes of a channel that went away are failed: an unconfirmed one to an
/// exchange the broker said is missing leaves that exchange in [`State::missing`], so the
/// next publish to it hears [`Error::NotFound`] (its own caller was answered at the hand-over).
pub(super) fn note_missing(state: &mut State, failure: &ChannelFailure) {
    let found = state
        .pending
        .values()
        .filter(|p| p.reply.is_none())
        .find_map(|p| match failure.error_for(&p.exchange) {
            Error::NotFound { name, reason, .. } => Some((name, reason)),
            _ => None,
        });
    if found.is_some() {
        state.missing = found;
    }
}

pub(super) fn fail_all(
    state: &mut State,
    observer: &Arc<dyn Observer>,
    error: impl Fn(&Pending) -> Error,
) {
    let mut unproven = 0usize;
    let mut why = None;
    for (_, mut p) in std::mem::take(&mut state.pending) {
        let Some(reply) = p.reply.take() else {
            // Unconfirmed: its caller was answered and the observer told when it was handed
            // over; whether the broker read it is unknown. Said once for all of them.
            unproven += 1;
            why.get_or_insert_with(|| error(&p).to_string());
            continue;
        };
        observer.publish_answered(&PublishEvent {
            exchange: &p.exchange,
            routing_key: &p.routing_key,
            outcome: PublishOutcome::Failed,
            duration: Some(p.started.elapsed()),
        });
        let failed = Err(error(&p));
        crate::intercept::tell_answered(p.answered, &failed);
        let _ = reply.send(failed);
    }
    if unproven > 0 {
        log::warn!(
            "acemq: {unproven} unconfirmed publishes were not yet known to have reached the \
             broker ({}): they may be lost (published without confirms: at most once)",
            why.unwrap_or_default()
        );
    }
}
