//! Ordered dispatch: one entity's messages in order, everything else at once; and the family's
//! partition function for ordering across processes.
//!
//! A queue delivers in order, and a consumer with `concurrency` above one stops honouring it:
//! usually the right trade, wrong where a later message about the same thing must not overtake
//! an earlier one (an "order cancelled" handled before the "order placed" it cancels).
//! [`ordered`] asks the consumer to keep the order **per key** and run different keys at once:
//!
//! ```no_run
//! use acemq_amqp::patterns::ordering::{by_header, ordered};
//! use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let handler = ordered(by_header("order-id"), |m: &Message| {
//!     println!("order event {}", m.id());
//!     Ok(Outcome::Accept)
//! });
//! let options = ConsumerOptions::new().concurrency(8).prefetch(256);
//! let running = connection.consumer("orders", options)?.start(handler)?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! # What is promised, exactly
//!
//! * **Same key: one at a time, in delivery order.** Within one consumer (one
//!   [`Consumer`](crate::Consumer), started or [`run`](crate::Consumer::run)), a message's
//!   handler starts only after the handler of every earlier delivery with the same key has
//!   finished and its outcome has been carried out (its copy, if any, confirmed). "Earlier" is
//!   the order the broker delivered them in on this consumer's channel.
//! * **Different keys run in parallel**, up to `concurrency`.
//! * **No key, no ordering.** A key function returning `None` or `""` (a missing header) leaves
//!   that message unordered: it runs as soon as a worker is free. Never one shared key: that
//!   would turn a producer's bug into a consumer's outage.
//! * **No worker waits for a key.** The consumer's owner thread (the one that holds the channel)
//!   computes the key as a delivery arrives; a delivery whose key is busy is held there,
//!   unacknowledged, in a first-in first-out queue for its key, and goes to a worker when the
//!   key is free. Meanwhile the workers run other keys' messages. The key function therefore
//!   runs on that thread: keep it cheap (a header lookup). If it panics, the message is handled
//!   unordered and the panic logged.
//!
//! # Retries
//!
//! * **By default** a message's key is freed as soon as its handler has returned and the
//!   outcome is carried out. A retry goes the usual way: a copy with attempt + 1 goes to the
//!   queue's tail after a wait in the consumer, or to a broker rung; either way it comes back as
//!   a **new delivery**, so **a later message with the same key may overtake it** — the key is
//!   free while the retry waits.
//! * **With [`Ordered::hold_on_retry`]** a keyed message's retry (and
//!   [`Outcome::InProgress`](crate::Outcome::InProgress)) is waited out **in the consumer, on the same delivery**, which
//!   stays unacknowledged and keeps its key; then the handler runs again on it with attempt + 1
//!   (no copy is published). Later messages with the key stay held behind it until it is
//!   finally settled: accepted, dead-lettered (attempts exhausted, too old, rejected) or parked.
//!   Every wait is spent in the consumer, rung-length ones too (no rung is used): keep the
//!   policy's delays well under the broker's `consumer_timeout` (30 min by default), which
//!   closes a channel holding a delivery longer. If the consumer stops or crashes meanwhile the
//!   broker redelivers the **original** (its first attempt number again).
//!
//! # Limits
//!
//! * **Held deliveries count against the prefetch.** Everything held is an unsettled delivery,
//!   and the broker sends no more than `prefetch` of them. If one slow (or retrying, with
//!   `hold_on_retry`) key's messages fill the window, other keys wait for room too. Give an
//!   ordered consumer a prefetch well above `concurrency` (e.g. the longest burst one key gets).
//! * **Within one consumer only.** Members of a [`ConsumerGroup`](crate::patterns::consumer_group::ConsumerGroup)
//!   or consumers in other processes each order their own deliveries; two of them may run the
//!   same key at once. For ordering across consumers, route each key to one queue with
//!   [`partitioned_routing_key`] and give each partition queue one consumer.
//! * **Redeliveries.** A message put back on the queue (closing, a copy that could not be
//!   published, a reconnect) is delivered again after messages the broker already sent, so it
//!   may come after later ones. After a reconnect the keys start free: a handler still running
//!   on the old channel may overlap its key's redeliveries.
//! * **Where the key is set.** Best on the consumer:
//!   [`ConsumerOptions::ordering`](crate::ConsumerOptions::ordering)`(`[`OrderBy::new`]`(key))`,
//!   which no wrapper around the handler can hide. [`ordered`] sets it on the handler instead
//!   ([`Handler::ordering`]), which the consumer honours when its options set none: the
//!   wrappers of this crate ([`chain`](fn@crate::patterns::chain::chain),
//!   [`idempotent`](fn@crate::patterns::idempotent::idempotent), the chain's layers) pass it on
//!   from the handler they wrap, but a closure (or any handler written by hand) that calls an
//!   ordered handler hides it: no ordering then. A handler's `handle` called by hand is not
//!   ordered.
//!
//! [`OrderBy::new`]: crate::OrderBy::new
//! * [`with_timeout`](crate::patterns::chain::with_timeout) settles an overrun on time while the
//!   handler's thread runs on: that message's key is freed then, and the next one may run beside
//!   the overrunning handler.
//!
//! # Partitions
//!
//! [`partition`] and [`partitioned_routing_key`] compute what the Go and Python AceMQ libraries
//! do: FNV-1a 32-bit over the key's UTF-8 bytes, unsigned, modulo the count (a count of 0 or 1
//! gives 0); routing key `{base}.{partition}`. (The Java library differs: signed `floorMod` and
//! `p{n}` keys.)

use crate::consume::{Handler, HandlerResult, OrderBy};
use crate::envelope::{HeaderValue, Message};

/// Orders by an application header (a tenant, a customer, an aggregate id): text as it is,
/// integers, booleans and floats in decimal, UTF-8 bytes as text; a missing header, or one of
/// another kind, gives no key (not ordered).
pub fn by_header(
    name: impl Into<String>,
) -> impl Fn(&Message) -> Option<String> + Send + Sync + Clone {
    let name = name.into();
    move |m: &Message| match m.headers.get(&name)? {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Int(i) => Some(i.to_string()),
        HeaderValue::Bool(b) => Some(b.to_string()),
        HeaderValue::Float(f) => Some(f.to_string()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

/// Orders by correlation id (`x-acemq-correlation`, the id when absent), which keeps one
/// business action's messages in sequence.
pub fn by_correlation() -> impl Fn(&Message) -> Option<String> + Send + Sync + Clone {
    |m: &Message| {
        Some(
            m.envelope
                .correlation_id
                .clone()
                .unwrap_or_else(|| m.id().to_string()),
        )
    }
}

/// Wraps `handler` so that the consumer running it handles messages with the same key one at a
/// time, in delivery order, and different keys in parallel. `key` is [`by_header`],
/// [`by_correlation`] or any `Fn(&Message) -> Option<String>`. See the [module docs](self) for
/// exactly what is promised.
pub fn ordered<K, H>(key: K, handler: H) -> Ordered<H>
where
    K: Fn(&Message) -> Option<String> + Send + Sync + 'static,
    H: Handler,
{
    Ordered {
        handler,
        order: OrderBy::new(key),
    }
}

/// A handler ordered by key, made by [`ordered`].
pub struct Ordered<H> {
    handler: H,
    order: OrderBy,
}

impl<H> Ordered<H> {
    /// A retry (or in-progress wait) of a keyed message is waited out in the consumer on the
    /// same delivery and keeps its key, so later messages with the key stay behind it until it
    /// is settled (see [Retries](self#retries)). Defaults to off: a retry frees the key and a
    /// later message with the key may overtake it.
    pub fn hold_on_retry(mut self) -> Self {
        self.order = self.order.hold_on_retry(true);
        self
    }
}

impl<H> std::fmt::Debug for Ordered<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ordered")
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Handler for Ordered<H> {
    fn handle(&self, message: &Message) -> HandlerResult {
        self.handler.handle(message)
    }

    fn ordering(&self) -> Option<&OrderBy> {
        Some(&self.order)
    }

    fn batch_limits(&self) -> Option<(usize, std::time::Duration)> {
        self.handler.batch_limits()
    }

    /// A batch holds no two messages with one key: the consumer hands a key's next message
    /// out only once the one before it is settled.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.handler.handle_batch(messages)
    }
}

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a 32-bit of `bytes`.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition of `key` among `partitions`, as every AceMQ library (Go, Python) computes it:
/// FNV-1a 32-bit over the key's UTF-8 bytes, unsigned, modulo `partitions`; 0 when
/// `partitions <= 1`.
///
/// ```
/// use acemq_amqp::patterns::ordering::partition;
/// assert_eq!(partition("o-1", 8), 0);
/// assert_eq!(partition("Ωmega", 7), 3);
/// ```
pub fn partition(key: &str, partitions: u32) -> u32 {
    if partitions <= 1 {
        return 0;
    }
    fnv1a32(key.as_bytes()) % partitions
}

/// `{base}.{partition(key, partitions)}`: the routing key that sends every message about `key`
/// to one partition queue.
///
/// ```
/// use acemq_amqp::patterns::ordering::partitioned_routing_key;
/// assert_eq!(partitioned_routing_key("orders", "customer-42", 8), "orders.6");
/// ```
pub fn partitioned_routing_key(base: &str, key: &str, partitions: u32) -> String {
    format!("{base}.{}", partition(key, partitions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a32_of_the_empty_key_is_the_offset_basis() {
        assert_eq!(fnv1a32(b""), 2_166_136_261);
        assert_eq!(fnv1a32("o-1".as_bytes()), 4_119_880_552);
    }

    #[test]
    fn keys_come_from_headers_of_several_kinds() {
        let key = by_header("order-id");
        let m = Message::new("x").with_header("order-id", "o-7");
        assert_eq!(key(&m).as_deref(), Some("o-7"));
        let m = Message::new("x").with_header("order-id", 42i64);
        assert_eq!(key(&m).as_deref(), Some("42"));
        assert_eq!(key(&Message::new("x")), None);
        let m = Message::new("x").with_correlation_id("c-1");
        assert_eq!(by_correlation()(&m).as_deref(), Some("c-1"));
    }
}
