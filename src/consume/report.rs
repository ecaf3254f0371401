//! [`CloseReport`]: what closing a consumer did (the owner's report, handed to whoever closes).

/// What closing a consumer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Handlers that were running when the close began and finished in time (settled).
    pub finished: usize,
    /// Deliveries received whose handler never started (on their way, waiting for a worker, or
    /// a retry held in the consumer), put back on the queue.
    pub requeued: usize,
    /// Handlers started and still running at the deadline (also one on a delivery from before a
    /// reconnect): not settled by us, not waited for; the broker requeues their messages when
    /// the channel closes.
    pub abandoned: usize,
}
