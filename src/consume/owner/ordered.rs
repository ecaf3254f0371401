//! Ordered dispatch on the owner thread ([`Handler::ordering`](super::Handler::ordering)): each
//! delivery's key, and the deliveries held, unsettled, behind a busy key in first-in first-out
//! order until its holder is done.

use std::collections::{HashMap, VecDeque};

use crate::consume::outcome::OrderBy;
use crate::consume::threads::protocol::Job;

/// One subscription's ordering keys: which are busy, with the deliveries waiting for each in
/// delivery order, and the key each delivery holding one holds.
pub(in crate::consume) struct Ordered<'a> {
    order: Option<&'a OrderBy>,
    waiting: HashMap<String, VecDeque<Job>>,
    /// The key each delivery holding one holds, by tag.
    key_of: HashMap<u64, String>,
}

impl<'a> Ordered<'a> {
    pub(in crate::consume) fn new(order: Option<&'a OrderBy>) -> Ordered<'a> {
        Ordered {
            order,
            waiting: HashMap::new(),
            key_of: HashMap::new(),
        }
    }

    /// Whether a keyed message's retries keep its key (`hold_on_retry`).
    pub(in crate::consume) fn holds_retries(&self) -> bool {
        self.order.is_some_and(|o| o.holds_retries())
    }

    /// A delivery the owner read: its key computed; the job to send to the workers now, or
    /// `None` when it waits behind its key's holder.
    pub(in crate::consume) fn admit(&mut self, mut job: Job) -> Option<Job> {
        let key = self.order.and_then(|o| o.key_of(&job.message));
        job.keyed = key.is_some();
        job.hold = job.keyed && self.holds_retries();
        match key {
            Some(key) => {
                self.key_of.insert(job.tag, key.clone());
                self.take_or_queue(&key, job)
            }
            None => Some(job),
        }
    }

    /// The delivery `tag` no longer holds its key: the next job waiting for the key, which now
    /// holds it, or `None`.
    pub(in crate::consume) fn release(&mut self, tag: u64) -> Option<Job> {
        let key = self.key_of.remove(&tag)?;
        self.release_key(&key)
    }

    /// Forgets the key of `tag` (its delivery is put back, closing).
    pub(in crate::consume) fn forget(&mut self, tag: u64) {
        self.key_of.remove(&tag);
    }

    /// Takes `key` for a delivery: true when it was free (send the job now), false when the job
    /// must wait (it was queued behind the key's holder).
    fn take_or_queue(&mut self, key: &str, job: Job) -> Option<Job> {
        match self.waiting.get_mut(key) {
            Some(queue) => {
                queue.push_back(job);
                None
            }
            None => {
                self.waiting.insert(key.to_string(), VecDeque::new());
                Some(job)
            }
        }
    }

    /// The holder of `key` is done with it: the next job waiting for it, which now holds it,
    /// or `None` (the key is free).
    fn release_key(&mut self, key: &str) -> Option<Job> {
        let queue = self.waiting.get_mut(key)?;
        match queue.pop_front() {
            Some(next) => Some(next),
            None => {
                self.waiting.remove(key);
                None
            }
        }
    }

    /// Every job waiting for a key, emptied (closing).
    pub(in crate::consume) fn drain(&mut self) -> Vec<Job> {
        self.waiting.drain().flat_map(|(_, q)| q).collect()
    }
}
