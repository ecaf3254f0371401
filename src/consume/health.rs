//! A running consumer's health report (`consumer:{queue}`): subscribed or not, deliveries in
//! flight, the age of its last settlement; registered on its connection while it runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::threads::context::Context;
use crate::envelope::now_ms;
use crate::health::{HealthReport, HealthSource};

/// What a running consumer shows in [`Connection::health`](crate::Connection::health).
pub(super) struct ConsumerHealth {
    pub(super) ctx: Arc<Context>,
    /// Set when the consumer's thread has ended (stopped, or failed).
    pub(super) ended: Arc<AtomicBool>,
}

impl HealthSource for ConsumerHealth {
    fn name(&self) -> String {
        match &self.ctx.label {
            Some(label) => format!("consumer:{}#{label}", self.ctx.queue),
            None => format!("consumer:{}", self.ctx.queue),
        }
    }

    fn report(&self) -> HealthReport {
        let ctx = &self.ctx;
        let taken = ctx.in_flight.count();
        let (subscribed, buffered) = match ctx.buffer.lock().as_ref() {
            Some(b) => (true, b.len()),
            None => (false, 0),
        };
        let last = ctx.last_settled_ms.load(Ordering::Relaxed);
        let age = (last > 0).then(|| u64::try_from(now_ms().saturating_sub(last)).unwrap_or(0));
        let ended = self.ended.load(Ordering::SeqCst);
        let mut report = if ended {
            // Degraded, as the family reports a stopped consumer: the connection works, nothing
            // reads this queue.
            HealthReport::degraded(
                "the consumer has stopped (stopped or failed); nothing reads the queue",
            )
        } else if ctx.paused.load(Ordering::SeqCst) {
            // Degraded, not down: the application paused it on purpose.
            HealthReport::degraded(
                "paused by the application: nothing reads the queue until resumed",
            )
        } else if subscribed {
            HealthReport::up()
        } else if ctx.stop_requested() {
            HealthReport::degraded("the consumer is stopping")
        } else {
            HealthReport::degraded("not subscribed: waiting for the connection to resubscribe")
        };
        report = report
            .part("queue", ctx.queue.clone())
            .part("subscribed", subscribed && !ended)
            .part("paused", ctx.paused.load(Ordering::SeqCst))
            .part("inFlight", taken + buffered)
            .part("prefetch", ctx.prefetch())
            .part("concurrency", ctx.concurrency())
            .part(
                "lastSettlementAgeMillis",
                age.map_or(serde_json::Value::Null, serde_json::Value::from),
            );
        report
    }
}
