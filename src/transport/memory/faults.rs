//! Faults on demand, for `testing::MemoryBroker`: cut connections, refuse new ones, nack
//! publishes, a memory alarm, held deliveries, the clock; and what a test reads (depth,
//! unacked, consumers, connections).

use std::sync::Arc;
use std::time::Duration;

use super::state::Broker;
use crate::transport::Blocked;

impl Broker {
    /// Every live connection drops as a lost socket; how many there were.
    pub(crate) fn cut_connections(self: &Arc<Self>) -> usize {
        self.with(|st| {
            let mut conns: Vec<u64> = st.conns.keys().copied().collect();
            conns.sort_unstable();
            for c in &conns {
                st.close_connection(*c, super::state::End::Cut);
            }
            conns.len()
        })
    }

    /// While on, connects fail as against a stopped broker.
    pub(crate) fn refuse_connections(self: &Arc<Self>, on: bool) {
        self.with(|st| st.refuse = on);
    }

    /// The next `n` publishes are nacked and not enqueued.
    pub(crate) fn nack_next_publishes(self: &Arc<Self>, n: u32) {
        self.with(|st| st.nack_next = n);
    }

    /// A memory alarm: every connection (and any that connects meanwhile) is blocked;
    /// publishes are held until [`unblock`](Self::unblock).
    pub(crate) fn block(self: &Arc<Self>, reason: &str) {
        self.with(|st| {
            st.blocked = Some(reason.to_string());
            for c in st.conns.values() {
                let _ = c.blocked_tx.send(Blocked::Blocked(reason.to_string()));
            }
        });
    }

    /// Ends the alarm: `Unblocked` to every connection, then the held publishes in order.
    pub(crate) fn unblock(self: &Arc<Self>) {
        self.with(|st| {
            if st.blocked.take().is_none() {
                return;
            }
            for c in st.conns.values() {
                let _ = c.blocked_tx.send(Blocked::Unblocked);
            }
            st.release_held();
        });
    }

    /// No dispatch to the queue's consumers until [`release_deliveries`](Self::release_deliveries).
    pub(crate) fn hold_deliveries(self: &Arc<Self>, queue: &str) {
        self.with(|st| {
            st.held_queues.insert(queue.to_string());
        });
    }

    pub(crate) fn release_deliveries(self: &Arc<Self>, queue: &str) {
        self.with(|st| {
            st.held_queues.remove(queue);
            st.mark(queue);
        });
    }

    /// Moves the broker clock on by `by`.
    /// How far the broker clock is ahead of the real one, in ms (what `advance_clock` added):
    /// the scheduler reads "now" as the broker does.
    pub(crate) fn clock_offset_ms(self: &Arc<Self>) -> i64 {
        self.with(|st| i64::try_from(st.offset.as_millis()).unwrap_or(i64::MAX))
    }

    pub(crate) fn advance_clock(self: &Arc<Self>, by: Duration) {
        self.advance(by);
    }

    /// Ready messages in the queue (None: no such queue).
    pub(crate) fn queue_depth(self: &Arc<Self>, queue: &str) -> Option<u32> {
        self.with(|st| {
            st.expire(queue);
            st.queues
                .get(queue)
                .map(|q| u32::try_from(q.ready.len()).unwrap_or(u32::MAX))
        })
    }

    /// Messages of the queue delivered and not settled.
    pub(crate) fn unacked(self: &Arc<Self>, queue: &str) -> Option<u32> {
        self.with(|st| st.queues.contains_key(queue).then(|| st.unacked_of(queue)))
    }

    pub(crate) fn consumer_count(self: &Arc<Self>, queue: &str) -> Option<u32> {
        self.with(|st| {
            st.queues
                .get(queue)
                .map(|q| u32::try_from(q.consumers.len()).unwrap_or(u32::MAX))
        })
    }

    pub(crate) fn connection_count(self: &Arc<Self>) -> usize {
        self.with(|st| st.conns.len())
    }
}
