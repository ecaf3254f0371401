//! The responder's handler wrapper: [`Answering::handle`] runs the user's handler on a request,
//! builds the reply (or the family's failure reply) and sends it — staged on the request's
//! channel for a transient reply queue, through a confirming publisher otherwise — and decides
//! the request's outcome; [`Counters`] keeps what became of the replies.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::transport::Return;

use super::reply::{Reply, ReplyHooks};
use super::wire::{failure, header_text, returned_header, REPLY_QUEUE_PREFIX};
use crate::consume::{HandlerResult, Outcome};
use crate::envelope::{headers, Message};
use crate::error::FatalError;
use crate::error::{panic_message, BoxError, Error};
use crate::publish::Publisher;

/// What became of a responder's requests and replies; shared by its [`Answering`], the
/// consumer's owner (through [`ReplyHooks`]) and the [`RunningResponder`](super::RunningResponder).
#[derive(Debug)]
pub(super) struct Counters {
    pub(super) queue: String,
    pub(super) answered: AtomicU64,
    pub(super) unanswerable: AtomicU64,
    pub(super) unroutable: AtomicU64,
}

impl Counters {
    /// A reply the broker could not route: no longer answered (when it was counted: a success
    /// reply), counted and logged.
    fn unroutable(&self, request_id: &str, address: &str, counted: bool) {
        if counted {
            self.answered.fetch_sub(1, Ordering::SeqCst);
        }
        self.unroutable.fetch_add(1, Ordering::SeqCst);
        log::warn!(
            "acemq: the reply to request {request_id} on {:?} is unroutable (its requester's \
             queue {address:?} is gone); the request is acknowledged",
            self.queue
        );
    }
}

/// What becomes of the replies sent on the request's channel (`reply.rs`).
impl ReplyHooks for Counters {
    fn not_sent(&self) {
        self.answered.fetch_sub(1, Ordering::SeqCst);
    }

    fn returned(&self, r: Return) {
        let request_id = returned_header(&r, headers::CAUSATION);
        // Only success replies are staged on the request's channel: each was counted.
        self.unroutable(&request_id, &r.routing_key, true);
    }
}

/// True for a reply queue that lives only as long as its requester's connection: the family's
/// generated `acemq-reply-<id>` (transient, exclusive, auto-delete, by the contract), a
/// server-named `amq.gen-…` queue and RabbitMQ's direct reply-to. A reply to one is sent on the
/// request's channel before the request's acknowledgement, unconfirmed (the module docs say why).
fn transient_reply_queue(address: &str) -> bool {
    address.starts_with(REPLY_QUEUE_PREFIX)
        || address.starts_with("amq.gen-")
        || address.starts_with("amq.rabbitmq.reply-to")
}

/// The handler a responder's consumer runs: the user's handler, and what it needs to send the
/// reply.
pub(super) struct Answering<F> {
    pub(super) handler: F,
    /// For replies that need the broker's confirm.
    pub(super) publisher: Publisher,
    /// The connection has publish interceptors: every reply goes through `publisher`.
    pub(super) intercepted: bool,
    /// The connection's origin, stamped on replies built here.
    pub(super) origin: String,
    /// The connection's frame limit, which a reply staged here must fit.
    pub(super) frame_max: usize,
    pub(super) counters: Arc<Counters>,
}

impl<F, R, E> Answering<F>
where
    F: Fn(&Message) -> std::result::Result<R, E>,
    R: Into<Message>,
    E: Into<BoxError>,
{
    /// Answers `request` (see the [module docs](super) for the wire): a reply to a named queue
    /// is confirmed before the request is accepted (or dead-lettered after a failure reply); one
    /// to a transient queue is staged for the consumer's owner, which publishes it on the
    /// request's channel just before the acknowledgement.
    pub(super) fn handle(&self, request: &Message) -> HandlerResult {
        let Some(address) = reply_address(request) else {
            self.counters.unanswerable.fetch_add(1, Ordering::SeqCst);
            return Err(Box::new(FatalError::new(format!(
                "request {} carries no reply address (neither the {} header nor reply_to)",
                request.id(),
                headers::REPLY_TO
            ))));
        };
        let (reply, mut failed) = match catch_unwind(AssertUnwindSafe(|| (self.handler)(request))) {
            Ok(Ok(reply)) => (reply.into(), None),
            Ok(Err(e)) => {
                let text = failure_text(&*e.into());
                (failure(&text), Some(text))
            }
            Err(panic) => {
                let text = format!("panic: {}", panic_message(panic.as_ref()));
                (failure(&text), Some(text))
            }
        };
        let mut reply = addressed(reply, request);
        // An answer is a success reply, as the family counts it: a failure reply tells the
        // caller at once but is not counted, or a responder failing every request would show
        // a healthy answered rate. Counted before the publish (a caller holding its reply finds
        // it counted), handed back if it does not go out or turns into a failure reply.
        let mut counted = failed.is_none();
        if counted {
            self.counters.answered.fetch_add(1, Ordering::SeqCst);
        }
        let uncount = |counted: &mut bool| {
            if std::mem::take(counted) {
                self.counters.answered.fetch_sub(1, Ordering::SeqCst);
            }
        };
        // A failure reply goes through the confirming publisher whatever the queue: the
        // request is dead-lettered after it (as the family's responders do), and its `.dlq`
        // copy and acknowledgement must not overtake an unconfirmed reply.
        if failed.is_none() && !self.intercepted && transient_reply_queue(&address) {
            let hooks = self.counters.clone();
            let built = Reply::build(
                address.clone(),
                reply,
                &self.origin,
                self.frame_max,
                request.id(),
                hooks,
            );
            match built {
                Ok(reply) => {
                    super::reply::stage(reply);
                    return Ok(Outcome::Accept);
                }
                // Never sent as is (the broker would close the connection, the request
                // would come back and go round again): the caller gets the family's failure
                // reply instead, and the request is dead-lettered as after any failure.
                Err(e @ Error::FrameTooLarge { .. }) => {
                    let text = reply_too_large(&e);
                    reply = addressed(failure(&text), request);
                    failed = Some(text);
                    uncount(&mut counted);
                }
                Err(e) => {
                    uncount(&mut counted);
                    return Err(Box::new(e));
                }
            }
        }
        // Answered (or unroutable): a success is accepted, a failure dead-lettered.
        let settled = |failed: &Option<String>| match failed {
            None => Outcome::Accept,
            Some(text) => Outcome::Reject {
                reason: text.clone(),
            },
        };
        loop {
            match self.publisher.publish("", &address, reply) {
                Ok(()) => return Ok(settled(&failed)),
                Err(e) if e.is_unroutable() => {
                    self.counters.unroutable(request.id(), &address, counted);
                    return Ok(settled(&failed));
                }
                // Refused before sending; handling the request again would make the same
                // reply. A reply that cannot fit is replaced by the family's failure reply;
                // a failure reply that cannot fit (a huge correlation id) by none.
                Err(e @ Error::FrameTooLarge { .. }) => match failed {
                    None => {
                        let text = reply_too_large(&e);
                        reply = addressed(failure(&text), request);
                        failed = Some(text);
                        uncount(&mut counted);
                    }
                    Some(text) => {
                        return Ok(Outcome::Reject {
                            reason: format!("{text}; its failure reply could not be sent: {e}"),
                        });
                    }
                },
                Err(e) => {
                    uncount(&mut counted);
                    return Err(Box::new(e));
                }
            }
        }
    }
}

/// `reply` made the answer to `request`: its correlation id (the request's, else the
/// request's id), its causation (the request), the AMQP correlation id kept from the request
/// unless set; what it carried as received is dropped.
fn addressed(mut reply: Message, request: &Message) -> Message {
    let correlation = request
        .envelope
        .correlation_id
        .clone()
        .unwrap_or_else(|| request.id().to_string());
    reply.envelope.correlation_id = Some(correlation);
    reply.envelope.causation_id = Some(request.id().to_string());
    if reply.amqp_correlation_id.is_none() {
        reply.amqp_correlation_id = request.amqp_correlation_id.clone();
    }
    reply.received = None;
    reply.properties = None;
    reply
}

/// The failure text for a reply refused by the frame limit (`e`, [`Error::FrameTooLarge`]).
fn reply_too_large(e: &Error) -> String {
    format!("Error: the reply could not be sent: {e}")
}

/// A handler's error as the family writes it in `acemq-error`: `{type}: {message}` (Python's
/// `ValueError: …`, Ruby's `RuntimeError: …`). A Rust error's type is not known behind a
/// [`BoxError`], so it is written as the consumer writes a handler's error in
/// `x-acemq-error`: `FatalError: …` for a [`FatalError`], `Error: …` for any other.
fn failure_text(e: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    match e.downcast_ref::<FatalError>() {
        Some(fatal) => format!("FatalError: {fatal}"),
        None => format!("Error: {e}"),
    }
}

/// Where a request's reply goes: the `acemq-reply-to` header (text or UTF-8 bytes) first, then
/// the AMQP `reply_to` property; empty is absent.
fn reply_address(request: &Message) -> Option<String> {
    request
        .headers
        .get(headers::REPLY_TO)
        .and_then(header_text)
        .filter(|s| !s.is_empty())
        .or_else(|| request.reply_to.clone().filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::HeaderValue;

    #[test]
    fn the_header_comes_before_the_property() {
        let m = Message::new("x")
            .with_header(
                headers::REPLY_TO,
                HeaderValue::Bytes(b"from-header".to_vec()),
            )
            .with_reply_to("from-property");
        assert_eq!(reply_address(&m).as_deref(), Some("from-header"));
        let m = Message::new("x").with_reply_to("from-property");
        assert_eq!(reply_address(&m).as_deref(), Some("from-property"));
        let m = Message::new("x")
            .with_header(headers::REPLY_TO, "")
            .with_reply_to("");
        assert_eq!(reply_address(&m), None);
    }

    #[test]
    fn a_failure_is_written_with_its_type() {
        let plain: BoxError = "no such sku".into();
        assert_eq!(failure_text(&*plain), "Error: no such sku");
        let fatal: BoxError = Box::new(FatalError::new("bad sku"));
        assert_eq!(failure_text(&*fatal), "FatalError: bad sku");
        let reply = failure("Error: x");
        assert_eq!(reply.body, b"null");
        assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    }
}
