//! Which deliveries of one subscription are settled, and the acknowledgements that follow
//! ([`Acks::flush`]: one `multiple` ack for the done run at the front, the others alone).

use std::collections::{BTreeMap, BTreeSet};

use crate::transport::{Channel, Delivery};

/// Which deliveries of one subscription are settled, by tag, and the acknowledgements that
/// follow. Tags on a channel are consecutive from 1 (RabbitMQ numbers every delivery on a
/// channel), so `front`, the lowest tag not known to be settled, is a delivery still running,
/// held, or not yet read: nothing at or behind it is covered by a `multiple` ack.
pub(in crate::consume) struct Acks {
    front: u64,
    /// Done, waiting for the next [`flush`](Self::flush).
    done: BTreeMap<u64, Delivery>,
    /// Settled above `front` (acknowledged alone, rejected, or acknowledged ahead of the
    /// handler): passed over when `front` reaches them.
    ahead: BTreeSet<u64>,
    /// Set when `ahead` outgrew its bound (a tag that never settles, which would be a bug): from
    /// then on every delivery is acknowledged alone, which is always exact.
    single_only: bool,
}

impl Acks {
    /// More than this many settled above a front that does not move: something never settles.
    const AHEAD_BOUND: usize = 100_000;

    pub(in crate::consume) fn new() -> Acks {
        Acks {
            front: 1,
            done: BTreeMap::new(),
            ahead: BTreeSet::new(),
            single_only: false,
        }
    }

    /// `delivery` may be acknowledged.
    pub(in crate::consume) fn done(&mut self, delivery: Delivery) {
        self.done.insert(delivery.delivery_tag(), delivery);
    }

    /// `tag` was settled some other way (rejected, or acknowledged already).
    pub(in crate::consume) fn settled(&mut self, tag: u64) {
        if tag >= self.front && !self.single_only {
            self.ahead.insert(tag);
        }
    }

    /// Acknowledges what is done: the completed run at the front with one `multiple` ack, every
    /// other done delivery alone.
    pub(in crate::consume) fn flush(
        &mut self,
        channel: &Channel,
    ) -> std::result::Result<(), crate::transport::AmqpError> {
        let mut last = None;
        while !self.single_only {
            if let Some(d) = self.done.remove(&self.front) {
                last = Some(d);
            } else if !self.ahead.remove(&self.front) {
                break;
            }
            self.front += 1;
        }
        if let Some(d) = last {
            d.ack_multiple(channel)?;
        }
        while let Some((tag, d)) = self.done.pop_first() {
            d.ack(channel)?;
            self.settled(tag);
        }
        if self.ahead.len() > Self::AHEAD_BOUND {
            log::error!(
                "acemq: delivery {} was never settled; acknowledging every delivery on its own \
                 from now on",
                self.front
            );
            self.ahead.clear();
            self.single_only = true;
        }
        Ok(())
    }
}
