//! Request/reply over RabbitMQ, as the AceMQ family does it: a [`RunningRequester`] asks and
//! blocks for the answer; a [`RunningResponder`] answers the requests arriving on a queue. Both
//! are made and started one way: `Requester::new(&connection, options)?.start()?` and
//! `Responder::new(&connection, queue, options)?.start(handler)?`; each closes with `close()`.
//!
//! # The wire (the family's contract)
//!
//! * Every request carries a fresh correlation id in `x-acemq-correlation` (the envelope's
//!   [`correlation_id`](crate::Envelope::correlation_id)) and its reply address twice: in the
//!   application header `acemq-reply-to` ([`headers::REPLY_TO`]) and in the AMQP `reply_to`
//!   property.
//! * A responder reads the address from the header first (text or bytes), then from the
//!   property. A request with neither cannot be answered: it is dead-lettered to `{queue}.dlq`
//!   as fatal (never retried) and counted ([`RunningResponder::unanswerable`]).
//! * The reply goes to the default exchange with the address as routing key,
//!   `x-acemq-correlation` = the request's correlation and `x-acemq-causation` = the request's
//!   id. (The AMQP `correlation_id` property of the request, if any, is echoed too, for plain
//!   AMQP clients; the family never pairs by it.)
//! * A failing handler (an error or a panic) is answered as the family's responders answer it:
//!   the body JSON `null` with content type `application/json` (a Python or Ruby requester
//!   decodes every reply, and an empty body would not decode: the caller would wait out its
//!   timeout), and the error text in the header `acemq-error` ([`headers::REPLY_ERROR`]) as
//!   `{type}: {message}` — `Error: …`, `FatalError: …` or `panic: …` here (Python writes
//!   `ValueError: …`). The reply is confirmed, and then the request is **dead-lettered** to
//!   `{queue}.dlq` (`x-acemq-error`: `the handler rejected it: Error: …`), as the Python, Go and
//!   Ruby responders reject it after their failure reply: the caller has its answer, a retry
//!   would answer it twice, and the failed request is kept for a person. (Java's responder
//!   sends no failure reply; its failed request is retried.) The asking side returns
//!   [`Error::Responder`] at once, with the header's text, for this reply and for the older
//!   empty one alike.
//! * The requester pairs a reply with its call by the reply envelope's correlation id only. A
//!   reply no call waits for (it came after its call timed out, or was never asked) is counted
//!   ([`RunningRequester::unmatched`]) and dropped with a debug log line.
//! * The default reply queue is `acemq-reply-<id>`: classic, transient, exclusive, auto-delete,
//!   owned by one requester. [`RequesterOptions::reply_queue`] names a durable (quorum) one
//!   instead.
//!
//! # Threads
//!
//! [`RunningRequester`] is `Send + Sync`: share it by reference (scoped threads) or in an
//! `Arc`, and ask from as many threads at once as you like; each call gets exactly its own
//! answer.
//!
//! * A call publishes its request itself (on the requester's request channel, under a lock held
//!   only for the hand-over to amiquip) and then **reads the reply queue itself**: every waiting
//!   call listens both on its own one-slot channel and on the reply consumer's receiver. A call
//!   that receives its own reply returns it at once (no thread in between); one that receives
//!   another call's reply hands it to that call's slot (looked up in a map of waiting calls —
//!   the only lock, never held across a network call). So a round trip costs the same thread
//!   hand-offs as a hand-written amiquip client.
//! * `acemq-requester` owns the amiquip channel that consumes the reply queue (amiquip's
//!   consumer cannot leave the thread that made it) and (re)declares it on each connection. It
//!   listens for the broker's returns of unroutable requests (each fails its call at once with
//!   [`Error::Unroutable`]) and for the end of the reply consumer; while no call waits it reads
//!   the replies itself every 100 ms (a late reply is counted and dropped).
//!
//! Requests are published `mandatory` **without** publisher confirms: a call waits for its
//! reply, which can only come after the broker routed the request, so a confirm would add a
//! broker round trip and a thread wake-up to every call and tell it nothing the reply does not.
//! An unroutable request comes back as a return; a request the broker loses (a rare internal
//! failure that a confirm would report as a nack) ends in [`Error::RequestTimeout`]. A request's
//! bytes are reserved in the connection's byte budget
//! ([`ConnectionOptions::max_unconfirmed_bytes`](crate::ConnectionOptions::max_unconfirmed_bytes))
//! like every publish's, waited for within the call's timeout, and given back when the call
//! ends — or, for a call that ends without its reply while the broker blocks publishing (a memory
//! alarm), once the broker unblocks: so requests never fill amiquip's buffer past the point
//! where it would block a thread without a deadline.
//!
//! The reply consumer acknowledges what it takes and has a prefetch of twice
//! [`RequesterOptions::window`] (at most 65,535): a backlog on a named reply queue (replies to a
//! requester that went away) stays in the broker rather than in amiquip's buffer. The
//! acknowledgements are `multiple`, sent by `acemq-requester` when half the prefetch is taken or
//! while idle, so a round trip pays no extra thread hand-off for them.
//!
//! A call blocks only the thread that made it. [`RunningResponder`] is `Send + Sync` too; it is a
//! [`RunningConsumer`](crate::RunningConsumer) underneath (`acemq-consumer`,
//! `acemq-worker-N`, `acemq-retry-timer`). The handler runs on a worker, which builds the reply
//! — or, with [`ConsumerOptions::inline`] in [`ResponderOptions::consumer`], on `acemq-consumer`
//! itself, which then reads the request, answers and acknowledges it on one thread as a
//! hand-written responder does (the fastest round trip: see the README's figures; closing then
//! waits for a running handler);
//! a reply to a transient reply queue (`acemq-reply-<id>`, `amq.gen-…`, direct reply-to) is
//! handed with the request's settlement to `acemq-consumer`, which publishes it on the request's
//! channel **just before** acknowledging the request, without a publisher confirm: RabbitMQ
//! handles one channel's frames in order, so the reply is routed by the time the broker takes
//! the acknowledgement, and if the connection drops in between neither took effect and the
//! request is answered again — the guarantee a confirm gave, for a queue that dies with its
//! requester anyway. A reply to any other (possibly durable) queue, and every reply when the
//! connection has publish interceptors, goes through a confirming publisher of the responder's
//! own, and the request is acknowledged once it is confirmed. Either way a reply the broker
//! cannot route is counted and its request acknowledged. (Confirming every reply cost the
//! responder about 11 context switches per request, against about 5 now; without the confirms 8
//! callers ask ~20 % more a second on this machine; see the README's figures.)
//!
//! # Recovery
//!
//! When the connection drops, every call waiting for a reply fails at once with a retriable
//! [`Error::ConnectionLost`] (its reply queue is gone with the connection); calls made while
//! the connection recovers wait (within their own timeout) for the new reply queue, which
//! `acemq-requester` declares on the new connection under a new name. A responder resumes as
//! any consumer does; a reply whose requester went away is unroutable: it is logged and counted
//! ([`RunningResponder::unroutable`]) and the request is acknowledged all the same.
//!
//! ```no_run
//! use acemq_amqp::patterns::request_reply::{
//!     Requester, RequesterOptions, Responder, ResponderOptions,
//! };
//! use acemq_amqp::{BoxError, Connection, Message, QueueSpec};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! connection.declare_queue(&QueueSpec::new("prices"))?;
//! let responder = Responder::new(&connection, "prices", ResponderOptions::new())?.start(
//!     |request: &Message| {
//!         let sku = std::str::from_utf8(&request.body)?;
//!         Ok::<_, BoxError>(format!("{sku}: 12.50"))
//!     },
//! )?;
//! let options = RequesterOptions::new().routing_key("prices");
//! let requester = Requester::new(&connection, options)?.start()?;
//! let reply = requester.ask("sku-1")?;
//! assert_eq!(reply.body, b"sku-1: 12.50");
//! requester.close()?;
//! responder.close()?;
//! # Ok(()) }
//! ```
//!
//! [`Error::ConnectionLost`]: crate::Error::ConnectionLost
//! [`Error::RequestTimeout`]: crate::Error::RequestTimeout
//! [`Error::Responder`]: crate::Error::Responder
//! [`Error::Unroutable`]: crate::Error::Unroutable
//! [`headers::REPLY_ERROR`]: crate::headers::REPLY_ERROR
//! [`headers::REPLY_TO`]: crate::headers::REPLY_TO
//! [`ConsumerOptions::inline`]: crate::ConsumerOptions::inline

mod answering;
mod calls;
mod reply;
mod reply_queue;
mod requester;
mod responder;
mod session;
mod wire;

pub use requester::{
    Requester, RequesterOptions, RequesterReport, RunningRequester, DEFAULT_REQUEST_TIMEOUT,
};
pub use responder::{Responder, ResponderOptions, RunningResponder};
pub use wire::REPLY_QUEUE_PREFIX;
