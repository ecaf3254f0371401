//! What the owner, the workers and the timer of one consumer share ([`Context`]), and the count
//! of deliveries in flight per subscription ([`InFlight`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::codec::Codec;
use crate::connection::Connection;
use crate::consume::hook::DeliveryHook;
use crate::consume::ladder::copy_failures::CopyFailures;
use crate::consume::ladder::policy::RetryPolicy;
use crate::consume::outcome::{Handler, OrderBy};
use crate::envelope::HeaderValue;
use crate::observe::Observer;
use crate::publish::Publisher;

/// What the owner and workers of one consumer share.
pub(crate) struct Context {
    pub(crate) queue: String,
    pub(crate) connection: Connection,
    pub(crate) publisher: Publisher,
    pub(crate) policy: RetryPolicy,
    pub(crate) codec: Arc<dyn Codec>,
    pub(crate) observer: Arc<dyn Observer>,
    /// The prefetch of each subscription: [`prefetch`](Self::prefetch); changed between two
    /// subscriptions by `RunningConsumer::set_prefetch` (`flow.rs`).
    pub(crate) prefetch_now: AtomicU16,
    /// Worker threads (a batching worker takes at most its share of the prefetch):
    /// [`concurrency`](Self::concurrency); changed between two subscriptions by
    /// `RunningConsumer::scale_to`.
    pub(crate) concurrency_now: AtomicUsize,
    pub(crate) exclusive: bool,
    pub(crate) arguments: BTreeMap<String, HeaderValue>,
    /// How long closing waits for running handlers: [`shutdown_timeout`](Self::shutdown_timeout);
    /// `RunningConsumer::drain` sets its own.
    pub(crate) shutdown_timeout_now: parking_lot::Mutex<Duration>,
    /// Paused by the application (`flow.rs`): not subscribed, on purpose, until resumed.
    pub(crate) paused: AtomicBool,
    /// Copies that could not be published, per message id, for the back-off.
    pub(crate) copy_failures: CopyFailures,
    /// The current subscription's generation; jobs from older ones are skipped.
    pub(crate) generation: AtomicU64,
    /// Set by a [`StopHandle`](crate::stop::StopHandle) (or by the owner when the broker
    /// cancels the consumer): the owner shuts down and workers requeue what they have not
    /// started.
    pub(crate) stopping: Arc<AtomicBool>,
    /// Deliveries taken from the subscription's buffer and not yet settled.
    pub(crate) in_flight: InFlight,
    /// The current subscription's buffer (amiquip's receiver), for what is received but not
    /// yet taken.
    pub(crate) buffer: parking_lot::Mutex<Option<crate::transport::Deliveries>>,
    pub(crate) max_in_flight: AtomicUsize,
    /// Handlers running now, of any generation.
    pub(crate) running: AtomicUsize,
    /// Handlers that ran and were settled, in the consumer's life (`CloseReport::handled`).
    pub(crate) handled: std::sync::atomic::AtomicU64,
    /// Their deliveries, held while their handlers run (`abandon.rs`).
    pub(crate) running_deliveries: super::abandon::RunningDeliveries,
    /// The hook's label (a group member's number, a stream reader's name): a suffix of the
    /// thread names and a tag in log lines.
    pub(crate) label: Option<String>,
    /// Acknowledge when a worker takes a delivery, before the handler runs.
    pub(crate) at_most_once: bool,
    /// The owner runs the handler itself ([`ConsumerOptions::inline`]).
    pub(crate) inline: bool,
    /// At-most-once deliveries whose handler failed: lost on purpose.
    pub(crate) lost: AtomicU64,
    /// The per-key ordering set on the options ([`ConsumerOptions::ordering`]); else the
    /// handler's ([`Handler::ordering`]).
    ///
    /// [`ConsumerOptions::ordering`]: super::ConsumerOptions::ordering
    /// [`Handler::ordering`]: super::Handler::ordering
    pub(crate) order: Option<Arc<OrderBy>>,
    /// The pattern taking part in each delivery's life, if any (`hook.rs`).
    pub(crate) hook: Option<Arc<dyn DeliveryHook>>,
    /// At most once: how long a worker waits for the owner's word that the ack went out.
    pub(crate) ack_first_wait: Duration,
    /// When a delivery was last settled (ms since the epoch; 0: none yet), for its health.
    pub(crate) last_settled_ms: std::sync::atomic::AtomicI64,
}

impl Context {
    /// The ordering this consumer keeps: its options', else its handler's.
    pub(crate) fn ordering<'a, H: Handler + ?Sized>(
        &'a self,
        handler: &'a H,
    ) -> Option<&'a OrderBy> {
        self.order.as_deref().or_else(|| handler.ordering())
    }

    /// The prefetch of the current (or next) subscription.
    pub(crate) fn prefetch(&self) -> u16 {
        self.prefetch_now.load(Ordering::SeqCst)
    }

    /// The worker threads of the current (or next) subscription.
    pub(crate) fn concurrency(&self) -> usize {
        self.concurrency_now.load(Ordering::SeqCst)
    }

    /// How long closing waits for running handlers.
    pub(crate) fn shutdown_timeout(&self) -> Duration {
        *self.shutdown_timeout_now.lock()
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// How log lines name this consumer: `"orders"`, or `"orders" (consumer 3)` in a group.
    pub(crate) fn who(&self) -> String {
        match &self.label {
            Some(label) => format!("{:?} (consumer {label})", self.queue),
            None => format!("{:?}", self.queue),
        }
    }

    /// A thread name: `base`, or `base-{label}` in a group.
    pub(crate) fn thread_name(&self, base: &str) -> String {
        match &self.label {
            Some(label) => format!("{base}-{label}"),
            None => base.to_string(),
        }
    }
}

/// Deliveries taken from the current subscription's buffer and not yet settled, counted **for
/// that subscription only**: one word holding the subscription's generation (its low 32 bits)
/// and the count, changed together. A worker that read a delivery of a subscription that has
/// just ended (the reconnect came between its read and its count) does not count it, and a
/// settlement from an ended subscription does not uncount one of the new: neither can leave a
/// count that nothing will ever settle, which would have every later close wait out its
/// timeout.
#[derive(Debug, Default)]
pub(crate) struct InFlight(AtomicU64);

impl InFlight {
    /// The count's bits; the generation's are above them.
    const COUNT: u64 = 0xFFFF_FFFF;

    fn tag(generation: u64) -> u64 {
        (generation & Self::COUNT) << 32
    }

    fn count_of(word: u64) -> usize {
        usize::try_from(word & Self::COUNT).unwrap_or(usize::MAX)
    }

    /// A new subscription, `generation`, starts with none.
    pub(crate) fn begin(&self, generation: u64) {
        self.0.store(Self::tag(generation), Ordering::SeqCst);
    }

    /// A delivery of subscription `generation` was taken: the new count, or `None` (not
    /// counted) when that subscription is no longer the current one.
    pub(crate) fn take(&self, generation: u64) -> Option<usize> {
        let tag = Self::tag(generation);
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w & !Self::COUNT == tag && w & Self::COUNT < Self::COUNT).then_some(w + 1)
            })
            .ok()
            .map(|w| Self::count_of(w + 1))
    }

    /// A delivery of subscription `generation` was settled (nothing changes for another one).
    pub(crate) fn gone(&self, generation: u64) {
        let tag = Self::tag(generation);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w & !Self::COUNT == tag && w & Self::COUNT > 0).then_some(w - 1)
            });
    }

    /// The subscription ended: how many were unsettled (the broker has them back).
    pub(crate) fn clear(&self) -> usize {
        Self::count_of(self.0.fetch_and(!Self::COUNT, Ordering::SeqCst))
    }

    /// How many are in flight now.
    pub(crate) fn count(&self) -> usize {
        Self::count_of(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    /// A worker reads a delivery of subscription 1 just as a reconnect begins subscription 2:
    /// it must not count in flight (nothing will ever settle it in generation 2), or every
    /// later close waits out its timeout for it.
    #[test]
    fn a_delivery_taken_for_a_subscription_that_ended_is_not_counted_in_flight() {
        let n = InFlight::default();
        n.begin(1);
        n.begin(2);
        assert_eq!(n.take(1), None);
        assert_eq!(n.count(), 0);
        assert_eq!(n.take(2), Some(1));
    }

    /// A settlement from before the reconnect does not uncount a delivery of the new one.
    #[test]
    fn a_settlement_from_an_ended_subscription_does_not_uncount_a_new_delivery() {
        let n = InFlight::default();
        n.begin(1);
        assert_eq!(n.take(1), Some(1));
        n.begin(2);
        assert_eq!(n.take(2), Some(1));
        n.gone(1);
        assert_eq!(n.count(), 1);
        n.gone(2);
        assert_eq!(n.count(), 0);
        n.gone(2);
        assert_eq!(n.count(), 0, "never below zero");
    }

    /// Clearing at the end of a subscription keeps its generation: a delivery of it read
    /// after the clear and before the next subscription counts until the next begins.
    #[test]
    fn clearing_says_how_many_were_unsettled() {
        let n = InFlight::default();
        n.begin(3);
        n.take(3);
        n.take(3);
        assert_eq!(n.clear(), 2);
        assert_eq!(n.count(), 0);
    }
}
