//! The publisher's options.

use std::sync::Arc;
use std::time::Duration;

use crate::codec::Codec;

/// Options for a [`Publisher`](crate::Publisher).
#[derive(Clone, Debug)]
pub struct PublisherOptions {
    pub(super) window: usize,
    pub(super) timeout: Duration,
    pub(super) mandatory: bool,
    pub(super) codec: Option<Arc<dyn Codec>>,
    pub(super) confirms: bool,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            window: 1024,
            timeout: Duration::from_secs(30),
            mandatory: true,
            codec: None,
            confirms: true,
        }
    }
}

impl PublisherOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every check of these options, in one place (run by `Connection::publisher_with`).
    pub(super) fn validate(&self) -> crate::error::Result<()> {
        if self.window == 0 {
            return Err(crate::error::Error::invalid(
                "the publisher window (PublisherOptions::window) must be at least 1, got 0",
            ));
        }
        Ok(())
    }

    /// The most publishes awaiting a confirm at once (without [confirms](Self::confirms): handed
    /// over and not yet known to have reached the broker); further callers wait for room.
    /// Defaults to 1024.
    #[must_use]
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// How long [`Publisher::publish`](crate::Publisher::publish) and [`Ticket::wait`](crate::Ticket::wait) wait for room, for recovery and for
    /// the confirm. Defaults to 30 s.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Publish with the mandatory flag, so an unroutable message is returned rather than
    /// dropped. Defaults to true.
    #[must_use]
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// Publishes with publisher confirms (`true`, at least once), or without them (`false`, **at
    /// most once**, on purpose). Defaults to true.
    ///
    /// Without confirms the channel is not put in confirm mode, and a publish returns once its
    /// frames are handed to the transport: its [`Ticket`](crate::Ticket) is answered at once,
    /// `Ok` meaning *handed over to be written*, not *taken by the broker*. A broker that
    /// drops it (its connection lost before it read the frames, a queue that cannot take it, a
    /// crash before a persistent message is written) says nothing, and nothing is resent. For
    /// messages cheaper to lose than to handle twice or to wait for — a metrics sample, a
    /// progress update, a cache invalidation; the consumer's side of the same choice is
    /// [`ConsumerOptions::at_most_once`](crate::ConsumerOptions::at_most_once).
    ///
    /// | confirms | a publish returns | guarantee | a message the broker loses |
    /// |---|---|---|---|
    /// | on (default) | once the broker confirmed it | at least once | is an error to the caller, who may resend (a duplicate is possible) |
    /// | off | once it is handed to the transport | at most once | is gone, and nobody is told |
    ///
    /// What still holds without confirms:
    ///
    /// - **Nothing is refused silently.** Validation errors, a header frame over the frame
    ///   limit and a closed publisher or connection are errors as before. A broker that blocks
    ///   publishing (a memory or disk alarm) or stops reading makes a publish wait for room up
    ///   to its [timeout](Self::timeout), then fail ([`Error::Blocked`](crate::Error::Blocked)
    ///   / [`Error::Timeout`](crate::Error::Timeout)). A missing exchange is known only after
    ///   the hand-over (the broker closes the channel): the next publish to that exchange is
    ///   refused with [`Error::NotFound`](crate::Error::NotFound), and what was handed over on
    ///   that channel and not yet known to be read is logged at warn as possibly lost.
    /// - **It is bounded.** What was handed over holds its bytes in the connection's budget
    ///   ([`ConnectionOptions::max_unconfirmed_bytes`](crate::ConnectionOptions::max_unconfirmed_bytes))
    ///   and its place in the [window](Self::window) until the broker is known to have read it:
    ///   the publisher's thread (`acemq-flush`) asks the broker for a synchronous answer on the
    ///   same channel (`basic.qos`, which changes nothing on a publishing channel) every few
    ///   milliseconds while publishes are outstanding, and at once when half the window is
    ///   used or a caller waits for room; the broker answers only after reading every frame
    ///   before it, so its answer releases them. A broker that stops reading keeps them held,
    ///   and callers wait for room with their deadline — never inside amiquip, whose own
    ///   buffers have no bound of their own.
    /// - **Unroutable messages are counted.** A [mandatory](Self::mandatory) message that
    ///   reaches no queue comes back (`basic.return`) with no caller left to tell: it is counted
    ///   ([`Publisher::unroutable`](crate::Publisher::unroutable)), reported to the observer as
    ///   outcome `unroutable` (after the `unconfirmed` of its publish) and logged (warn, then
    ///   debug).
    ///
    /// The library's own copies never go through such a publisher: a retry, dead-letter or
    /// parked copy, a pipeline step or a routing slip's hop must be confirmed before the
    /// original is settled, so [`Publisher::publish_all`](crate::Publisher::publish_all), a
    /// pipeline step ([`then`](crate::patterns::pipeline::then)) and a routing slip
    /// ([`follow_slip`](crate::patterns::routing_slip::follow_slip),
    /// [`RoutingSlip::send`](crate::patterns::routing_slip::RoutingSlip::send)) refuse a
    /// publisher without confirms ([`Error::InvalidArgument`](crate::Error::InvalidArgument)).
    ///
    /// ```no_run
    /// use acemq_amqp::{Connection, Message, PublisherOptions};
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let connection = Connection::open("amqp://127.0.0.1")?;
    /// let samples = connection.publisher_with(PublisherOptions::new().confirms(false))?;
    /// samples.publish("metrics", "cpu", Message::new("0.42"))?; // handed over, not confirmed
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn confirms(mut self, confirms: bool) -> Self {
        self.confirms = confirms;
        self
    }

    /// The codec for [`Publisher::publish_value`](crate::Publisher::publish_value). Defaults to the connection's.
    #[must_use]
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
}
