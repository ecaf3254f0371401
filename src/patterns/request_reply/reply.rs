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
//! consumer's [`DeliveryHook`] ([`ReplyOnChannel`], `consume/hook.rs`) takes it back on that
//! thread right after the handler, and, for an accepted request, hands it to the engine as the
//! [`BeforeAck`] of the request's settlement; the owner thread publishes it (mandatory) and then
//! acknowledges. A reply the broker cannot route comes back on the channel's return listener,
//! read by the owner, and goes to the hook. A reply that never went out (the request was not
//! accepted after all, the channel broke, the settlement belonged to a channel that is gone)
//! tells the [`ReplyHooks`] so when it is dropped.

use std::cell::RefCell;
use std::sync::Arc;

use crate::transport::{AmqpProperties, Publish, Return};

use crate::consume::{BeforeAck, DeliveryHook, OnChannel};
use crate::envelope::Message;
use crate::trace::PublishSpan;

/// What the responder counts about its replies.
pub(super) trait ReplyHooks: Send + Sync + std::fmt::Debug {
    /// A staged reply was dropped without being published (it will be answered again when the
    /// request is redelivered, or the request was not accepted).
    fn not_sent(&self);
    /// The broker returned a published reply as unroutable (its requester is gone).
    fn returned(&self, returned: Return);
}

/// A reply ready to be published by the owner thread.
pub(super) struct Reply {
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
    pub(super) fn build(
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
}

impl BeforeAck for Reply {
    /// Publishes it (mandatory, through the default exchange, reported to the observer) on the
    /// request's channel: the owner runs this before it acknowledges the request there.
    fn run(self: Box<Self>, channel: OnChannel<'_>) -> Result<(), crate::transport::AmqpError> {
        let mut this = self;
        this.publish(channel)
    }
}

impl Reply {
    fn publish(&mut self, channel: OnChannel<'_>) -> Result<(), crate::transport::AmqpError> {
        let properties = std::mem::take(&mut self.properties);
        let routing_key = std::mem::take(&mut self.routing_key);
        let publish = Publish {
            body: &self.body,
            routing_key,
            mandatory: true,
            properties,
        };
        channel.publish("", publish)?;
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
pub(super) fn stage(reply: Reply) {
    STAGED.with(|s| *s.borrow_mut() = Some(Box::new(reply)));
}

/// Takes the reply staged on this thread, if any. The hook calls it once per handled request,
/// whatever the verdict, so that nothing staged outlives its request.
fn take() -> Option<Box<Reply>> {
    STAGED.with(|s| s.borrow_mut().take())
}

/// A responder consumer's [`DeliveryHook`]: the reply its handler staged goes out on the
/// request's channel just before the request's ack; what the broker returns goes to `hooks`.
#[derive(Debug)]
pub(super) struct ReplyOnChannel {
    pub(super) hooks: Arc<dyn ReplyHooks>,
}

impl DeliveryHook for ReplyOnChannel {
    fn after_handler(&self, accepted: bool) -> Option<Box<dyn BeforeAck>> {
        // Taken whatever the verdict (nothing staged may outlive its request); dropped unless
        // the request is accepted, which the hooks count as not sent.
        let reply = take()?;
        accepted.then_some(reply as Box<dyn BeforeAck>)
    }

    fn listens_for_returns(&self) -> bool {
        true
    }

    fn returned(&self, returned: Return) {
        self.hooks.returned(returned);
    }
}
