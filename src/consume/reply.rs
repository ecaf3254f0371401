//! Replies sent on the request's own channel, just before the request is acknowledged (the
//! request/reply pattern's [`Responder`](crate::patterns::request_reply::Responder)).
//!
//! **Why here and not through a [`Publisher`](crate::Publisher).** A reply published with
//! confirms costs the responder more thread wake-ups per request than raw amiquip's
//! publish-then-ack (the broker's confirm through amiquip's I/O thread to the confirm thread and
//! on to the waiting worker, besides the confirm work in the broker: about 11 context switches
//! per request against about 5 this way); on a two-core machine shared with the broker that
//! was a fifth of what 8 callers could ask (measured with `examples/bench.rs`, the
//! request/reply rows). For a reply to a transient reply queue the
//! guarantee the confirm bought is kept another way: RabbitMQ handles one channel's frames in
//! order, so a reply published on the request's channel **before** its acknowledgement has been
//! routed by the time the broker takes the acknowledgement; if the connection drops in between,
//! neither took effect and the request is delivered (and answered) again. (A confirm of a
//! message to a transient queue says no more than "routed".) Replies to other queues are
//! confirmed by the responder before the request is settled, as any copy is.
//!
//! **The path.** The responder's handler runs on a worker, builds the reply (validated, its
//! AMQP properties made there, off the owner thread) and [`stage`]s it on that thread; the
//! worker [`take`]s it when it settles an accepted request and sends it with the settlement;
//! the owner thread publishes it (mandatory) and then acknowledges. A reply the broker cannot
//! route comes back on the channel's return listener, read by the owner, and goes to the
//! [`ReplyHooks`]. A reply that never went out (the request was not accepted after all, the
//! channel broke, the settlement belonged to a channel that is gone) tells the hooks so when it
//! is dropped.

use std::cell::RefCell;
use std::sync::Arc;

use crate::transport::{AmqpProperties, Channel, Publish, Return};

use crate::envelope::Message;
use crate::observe::Observer;
use crate::trace::PublishSpan;

/// What the responder counts about its replies.
pub(crate) trait ReplyHooks: Send + Sync + std::fmt::Debug {
    /// A staged reply was dropped without being published (it will be answered again when the
    /// request is redelivered, or the request was not accepted).
    fn not_sent(&self);
    /// The broker returned a published reply as unroutable (its requester is gone).
    fn returned(&self, returned: Return);
}

/// A reply ready to be published by the owner thread.
pub(crate) struct Reply {
    routing_key: String,
    body: Vec<u8>,
    properties: AmqpProperties,
    /// The request it answers, for the span's error.
    request_id: String,
    span: PublishSpan,
    hooks: Arc<dyn ReplyHooks>,
    sent: bool,
}

impl Reply {
    /// `message` to `address` through the default exchange, checked and stamped as any publish
    /// ([`prepare`](crate::publish::prepare)) and its AMQP properties built here, on the
    /// worker, so that the owner thread only hands it over.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName),
    /// [`Error::InvalidHeader`](crate::Error::InvalidHeader), as for any publish;
    /// [`Error::FrameTooLarge`](crate::Error::FrameTooLarge) when its header frame would not
    /// fit in a frame of `frame_max` bytes (the broker would close the whole connection).
    pub(crate) fn build(
        address: String,
        mut message: Message,
        origin: &str,
        frame_max: usize,
        request_id: &str,
        hooks: Arc<dyn ReplyHooks>,
    ) -> crate::Result<Reply> {
        let mut span = crate::publish::prepare("", &address, &mut message)?;
        let properties = message.to_properties(&address, Some(origin));
        if let Err(e) = crate::publish::check_fits(&properties, frame_max) {
            span.end(Err(&e));
            return Err(e);
        }
        Ok(Reply {
            properties,
            routing_key: address,
            body: message.body,
            request_id: request_id.to_string(),
            span,
            hooks,
            sent: false,
        })
    }

    /// Publishes it (mandatory, through the default exchange, reported to `observer`) on
    /// `channel`: the owner calls this before it acknowledges the request on the same channel.
    pub(crate) fn publish(
        mut self,
        channel: &Channel,
        observer: &dyn Observer,
    ) -> Result<(), crate::transport::AmqpError> {
        let properties = std::mem::take(&mut self.properties);
        let routing_key = std::mem::take(&mut self.routing_key);
        let publish = Publish {
            body: &self.body,
            routing_key,
            mandatory: true,
            properties,
        };
        crate::publish::send_unconfirmed(channel, "", publish, observer)?;
        self.sent = true;
        self.span.end(Ok(()));
        Ok(())
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.sent {
            let error = crate::Error::ConnectionLost {
                context: format!(
                    "replying to request {:?}: not sent (the request was not acknowledged, or \
                     its channel went away first)",
                    self.request_id
                ),
            };
            self.span.end(Err(&error));
            self.hooks.not_sent();
        }
    }
}

thread_local! {
    static STAGED: RefCell<Option<Box<Reply>>> = const { RefCell::new(None) };
}

/// Stages `reply` for the request being handled on this thread (replacing any staged before).
pub(crate) fn stage(reply: Reply) {
    STAGED.with(|s| *s.borrow_mut() = Some(Box::new(reply)));
}

/// Takes the reply staged on this thread, if any. Workers call it once per handled request,
/// whatever the verdict, so that nothing staged outlives its request.
pub(crate) fn take() -> Option<Box<Reply>> {
    STAGED.with(|s| s.borrow_mut().take())
}
