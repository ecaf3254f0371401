//! The live reply queue as a call holds it ([`Session`]: the request channel and the replies'
//! receiver) and the replies taken from it and not yet acknowledged ([`ReplyAcks`]).

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// One reply queue on one connection, and what a call needs from it: the channel requests are
/// published on and the receiver the replies arrive on. Each call holds a clone.
#[derive(Clone)]
pub(super) struct Session {
    /// Counts sessions, so a report about an old one is not taken for the live one.
    pub(super) number: u64,
    pub(super) queue: String,
    /// Taken out and closed by `acemq-requester` when the session ends.
    pub(super) requests: Arc<Mutex<Option<crate::transport::Channel>>>,
    pub(super) replies: crate::transport::Deliveries,
    /// The reply deliveries taken and acknowledged on this session's channel.
    pub(super) acks: Arc<ReplyAcks>,
}

/// The reply deliveries taken (by the calls, or by `acemq-requester`) and not yet acknowledged;
/// `acemq-requester`, which owns the channel, acknowledges them (`multiple`, the highest tag).
#[derive(Debug)]
pub(super) struct ReplyAcks {
    taken: Sender<crate::transport::Delivery>,
    queue: Receiver<crate::transport::Delivery>,
    /// Half the prefetch: this many taken, `acemq-requester` is woken to acknowledge.
    half: usize,
}

impl ReplyAcks {
    /// Room for the prefetch: no more deliveries than that are ever unacknowledged.
    pub(super) fn new(prefetch: u16) -> ReplyAcks {
        let (taken, queue) = crossbeam_channel::bounded(usize::from(prefetch).max(1));
        ReplyAcks {
            taken,
            queue,
            half: usize::from(prefetch / 2).max(1),
        }
    }

    /// A delivery was taken (its message read out); true when it is time to acknowledge.
    pub(super) fn took(&self, delivery: crate::transport::Delivery) -> bool {
        // Full cannot happen (at most the prefetch is unacknowledged); a delivery not kept is
        // covered by the `multiple` acknowledgement of a later one anyway.
        let _ = self.taken.try_send(delivery);
        self.taken.len() >= self.half
    }

    /// Acknowledges everything taken so far, on the reply channel.
    pub(super) fn ack(&self, channel: &crate::transport::Channel) {
        let mut highest: Option<crate::transport::Delivery> = None;
        while let Ok(d) = self.queue.try_recv() {
            if highest
                .as_ref()
                .is_none_or(|h| d.delivery_tag() > h.delivery_tag())
            {
                highest = Some(d);
            }
        }
        if let Some(d) = highest {
            if let Err(e) = d.ack_multiple(channel) {
                // The channel is gone: the consumer's end is noticed on its receiver.
                log::debug!("acemq: acknowledging replies: {e}");
            }
        }
    }
}
