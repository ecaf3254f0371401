//! What a publisher's callers and its confirm thread share: the pending publishes by delivery
//! tag, the current channel, and why a channel went away.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::transport::{Confirm, Feed, Return};
use parking_lot::{Condvar, Mutex};

use crate::connection::Reservation;
use crate::error::{Error, Result};
use crate::observe::{Observer, PublishEvent, PublishOutcome};

/// What the confirm thread and callers share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) room: Condvar,
    pub(super) observer: Arc<dyn Observer>,
}

pub(super) struct State {
    pub(super) current: Option<Current>,
    /// Bumped per channel; confirms from an older channel are ignored.
    pub(super) epoch: u64,
    pub(super) pending: BTreeMap<u64, Pending>,
    pub(super) closed: bool,
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
    pub(super) reply: oneshot::Sender<Result<()>>,
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

pub(super) fn fail_all(
    state: &mut State,
    observer: &Arc<dyn Observer>,
    error: impl Fn(&Pending) -> Error,
) {
    for (_, p) in std::mem::take(&mut state.pending) {
        observer.publish_answered(&PublishEvent {
            exchange: &p.exchange,
            routing_key: &p.routing_key,
            outcome: PublishOutcome::Failed,
            duration: Some(p.started.elapsed()),
        });
        let failed = Err(error(&p));
        crate::intercept::tell_answered(p.answered, &failed);
        let _ = p.reply.send(failed);
    }
}
