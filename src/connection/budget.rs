//! The unconfirmed bytes of one connection, shared by its publishers: the bound that keeps every
//! publish out of amiquip's blocking path.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::envelope::Message;

/// The unconfirmed bytes of one connection, shared by its publishers.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

impl ByteBudget {
    pub(crate) fn new(max: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            max,
        })
    }

    /// What `message` takes of the budget: its body and a generous allowance for the frame
    /// and header overhead.
    pub(crate) fn size_of(message: &Message) -> usize {
        message.body.len().saturating_add(4096)
    }

    /// Takes `bytes` (a message larger than the whole budget goes alone), waiting for room up
    /// to `deadline`.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Instant,
    ) -> Option<Reservation> {
        let mut used = self.used.lock();
        while *used > 0 && used.saturating_add(bytes) > self.max {
            if self.freed.wait_until(&mut used, deadline).timed_out() {
                return None;
            }
        }
        *used += bytes;
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock();
        *used = used.saturating_sub(self.bytes);
        self.budget.freed.notify_all();
    }
}
