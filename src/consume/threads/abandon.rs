//! The deliveries whose handlers are running ([`RunningDeliveries`]): held here, not by their
//! worker, while the handler runs, so that a consumer closing past its shutdown deadline can give
//! back what it abandons itself — by the rule of `put_back.rs` — instead of leaving it to the
//! channel's close, which RabbitMQ 4.x counts as a return against a quorum queue's delivery
//! limit. A worker whose handler (single or batch) ends after that finds its delivery gone and
//! settles nothing. Workers park a job here with `Job::park` and take it back with
//! `Parked::unpark` (`protocol.rs`).

use std::collections::HashMap;

use crate::envelope::Message;
use crate::transport::Delivery;

struct Entry {
    delivery: Delivery,
    /// A copy of the message, kept only when the broker has counted a return of it (so that it
    /// can be put back as a fresh copy); none for the common first delivery.
    copy: Option<Message>,
}

/// Running deliveries by (generation, delivery tag); at most one per worker.
#[derive(Default)]
pub(crate) struct RunningDeliveries(parking_lot::Mutex<HashMap<(u64, u64), Entry>>);

impl RunningDeliveries {
    /// The handler of `message` (delivery `tag` of subscription `generation`) starts.
    pub(crate) fn hold(&self, generation: u64, tag: u64, delivery: Delivery, message: &Message) {
        let copy = (message.returns_counted() > 0).then(|| message.clone());
        self.0
            .lock()
            .insert((generation, tag), Entry { delivery, copy });
    }

    /// The handler ended: its delivery, or `None` when the closing consumer gave it back.
    pub(crate) fn release(&self, generation: u64, tag: u64) -> Option<Delivery> {
        self.0.lock().remove(&(generation, tag)).map(|e| e.delivery)
    }

    /// Every delivery of `generation` still running, taken away from its worker, with the copy
    /// of its message when one was kept.
    pub(crate) fn abandon(&self, generation: u64) -> Vec<(Delivery, Option<Message>)> {
        let mut map = self.0.lock();
        let keys: Vec<_> = map.keys().filter(|k| k.0 == generation).copied().collect();
        keys.into_iter()
            .filter_map(|k| map.remove(&k))
            .map(|e| (e.delivery, e.copy))
            .collect()
    }
}
