//! The names of the reserved headers of the wire contract, as the AceMQ family writes them.
//!
//! The prefix is reserved as a namespace: an application may not set a header that starts with
//! it, and on receipt every header that starts with it is kept away from the application's
//! headers, whether this crate knows the name or not.

/// The prefix reserved for the engine: an application header with it is refused.
pub const RESERVED_PREFIX: &str = "x-acemq-";
/// Stable message identity (long string); also the AMQP `message_id`. Always written.
pub const ID: &str = "x-acemq-id";
/// Message type, e.g. `order.placed` (long string). Always written: the routing key when
/// not set (`message` when that is empty too).
pub const TYPE: &str = "x-acemq-type";
/// Schema version of the payload, from 1 (32-bit integer). Always written.
pub const VERSION: &str = "x-acemq-version";
/// Correlation of one business action (long string). Always written: the id when not set.
pub const CORRELATION: &str = "x-acemq-correlation";
/// Id of the message that caused this one (long string). Written only when set.
pub const CAUSATION: &str = "x-acemq-causation";
/// 1 on first delivery, +1 per retry (32-bit integer). Always written.
pub const ATTEMPT: &str = "x-acemq-attempt";
/// Epoch milliseconds when first published (64-bit integer). Always written.
pub const FIRST_SEEN: &str = "x-acemq-first-seen";
/// `service@host` of the publisher (long string). Always written by this crate.
pub const ORIGIN: &str = "x-acemq-origin";
/// Why a copy was dead-lettered or parked (long string). Written only when set.
pub const ERROR: &str = "x-acemq-error";
/// Where a claim-checked payload is kept (long string). Written only when set.
pub const CLAIM: &str = "x-acemq-claim";
/// A declared route: comma-separated step names (long string).
pub const ROUTE: &str = "x-acemq-route";
/// 0-based position in the declared route (32-bit integer).
pub const ROUTE_POSITION: &str = "x-acemq-route-position";
/// The run id of a declared route (long string).
pub const ROUTE_ID: &str = "x-acemq-route-id";

// Headers the family's patterns write *outside* the reserved prefix, so that they reach
// the application's handlers (an `x-acemq-` name a reader does not know is dropped).

/// Request/reply: where the reply goes (also the AMQP `reply_to` property).
pub const REPLY_TO: &str = "acemq-reply-to";
/// Request/reply: a responder's failure text on an empty reply.
pub const REPLY_ERROR: &str = "acemq-error";
/// Routing slip, JSON form.
pub const ROUTING_SLIP: &str = "acemq-routing-slip";
/// Replay: the queue a message was replayed from.
pub const REPLAYED_FROM: &str = "acemq-replayed-from";
/// Replay: when (an RFC 3339 instant).
pub const REPLAYED_AT: &str = "acemq-replayed-at";
/// Replay: how many times (integer).
pub const REPLAY_COUNT: &str = "acemq-replay-count";
/// Scheduler: the exchange to deliver to when due.
pub const SCHEDULE_EXCHANGE: &str = "x-schedule-exchange";
/// Scheduler: the routing key to deliver with when due.
pub const SCHEDULE_ROUTING_KEY: &str = "x-schedule-routing-key";
/// Scheduler: when it is due (epoch milliseconds, integer).
pub const SCHEDULE_DUE_AT: &str = "x-schedule-due-at";
/// Scheduler: the content type to deliver with.
pub const SCHEDULE_CONTENT_TYPE: &str = "x-schedule-content-type";
/// Replay: the exchange a message was first published to, written by this crate's consumer on
/// its retry, dead-letter and parked copies when not there yet (empty: the default exchange).
pub const ORIGINAL_EXCHANGE: &str = "acemq-original-exchange";
/// Replay: the routing key a message was first published with (see [`ORIGINAL_EXCHANGE`]).
pub const ORIGINAL_ROUTING_KEY: &str = "acemq-original-routing-key";
/// Replay: the queue a message was first consumed from (see [`ORIGINAL_EXCHANGE`]).
pub const ORIGINAL_QUEUE: &str = "acemq-original-queue";

// W3C trace context, unprefixed as the whole family writes it (so tooling that knows nothing of
// AceMQ reads it, and a trace started anywhere continues through here).

/// W3C trace context: `00-<trace id>-<parent id>-<flags>` (see [`crate::trace`]).
pub const TRACEPARENT: &str = "traceparent";
/// W3C trace context: the vendors' list that travels with [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
