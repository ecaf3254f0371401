//! The back-off of an original whose copy could not be published: failures per message id
//! ([`CopyFailures`]) and the pause they give ([`copy_failure_pause`]).

use std::time::Duration;

/// The pause before an original whose copy failed goes back: 1 s, doubling with each failure
/// of the same message here, at most 30 s, drawn between half and all of that (the
/// connection's reconnect back-off).
pub(crate) fn copy_failure_pause(failures: u32) -> Duration {
    crate::connection::backoff(Duration::from_secs(1), Duration::from_secs(30), failures)
}

/// Copy failures per message id on this consumer, for the back-off; bounded (forgotten
/// wholesale past its capacity, which only shortens some pauses).
#[derive(Default)]
pub(crate) struct CopyFailures(parking_lot::Mutex<std::collections::HashMap<String, u32>>);

impl CopyFailures {
    const CAPACITY: usize = 10_000;

    pub(crate) fn failed(&self, id: &str) -> u32 {
        let mut map = self.0.lock();
        if map.len() >= Self::CAPACITY && !map.contains_key(id) {
            map.clear();
        }
        let n = map.entry(id.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn succeeded(&self, id: &str) {
        let mut map = self.0.lock();
        if !map.is_empty() {
            map.remove(id);
        }
    }
}
