//! [`CloseReport`]: what closing a consumer did (the owner's report, handed to whoever closes).

/// What closing a consumer did, and what the consumer handled in its life.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Messages whose handler ran and whose outcome was settled, over the consumer's whole life
    /// (every subscription, across reconnects; the closing ones included).
    pub handled: u64,
    /// Of those, the handlers that were **already running when the close began** and finished
    /// within the shutdown timeout (settled). 0 for a consumer that was idle when closed.
    pub finished_in_time: usize,
    /// Deliveries received whose handler never started (on their way, waiting for a worker, or
    /// a retry held in the consumer), put back on the queue.
    pub requeued: usize,
    /// Handlers started and still running at the deadline (also one on a delivery from before a
    /// reconnect): not settled by us, not waited for; the broker requeues their messages when
    /// the channel closes.
    pub abandoned: usize,
}
