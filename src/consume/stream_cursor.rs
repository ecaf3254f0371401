//! Where a stream reader is: the offsets whose handler is running and the offset after the last
//! one finished, so that a reader subscribing again (after a reconnect) starts where nothing is
//! missed.

use std::collections::BTreeSet;

use parking_lot::Mutex;

use crate::envelope::{HeaderValue, Message};

/// The header RabbitMQ stamps on every stream delivery: its offset in the log.
pub(crate) const STREAM_OFFSET: &str = "x-stream-offset";

/// A stream reader's position. Shared by its workers and its owner thread.
#[derive(Debug, Default)]
pub(crate) struct StreamCursor {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Offsets handed to a handler and not finished (handled and copied).
    running: BTreeSet<u64>,
    /// One past the highest finished offset.
    next: Option<u64>,
}

/// The offset the broker stamped on a stream delivery, in any integer width.
pub(crate) fn offset_of(message: &Message) -> Option<u64> {
    match message.headers.get(STREAM_OFFSET)? {
        HeaderValue::Int(i) => u64::try_from(*i).ok(),
        HeaderValue::Text(t) => t.parse().ok(),
        _ => None,
    }
}

impl StreamCursor {
    /// A handler starts on `message`; its offset, when it has one.
    pub(crate) fn started(&self, message: &Message) -> Option<u64> {
        let offset = offset_of(message)?;
        self.state.lock().running.insert(offset);
        Some(offset)
    }

    /// The message at `offset` is done with (handled; its copy, if any, confirmed).
    pub(crate) fn finished(&self, offset: u64) {
        let mut s = self.state.lock();
        s.running.remove(&offset);
        let after = offset.saturating_add(1);
        if s.next.is_none_or(|n| n < after) {
            s.next = Some(after);
        }
    }

    /// Where to start again so that nothing is missed: the lowest offset still running, else one
    /// past the last finished; `None` before anything was read.
    pub(crate) fn resume_at(&self) -> Option<u64> {
        let s = self.state.lock();
        match (s.running.first(), s.next) {
            (Some(r), Some(n)) => Some((*r).min(n)),
            (Some(r), None) => Some(*r),
            (None, n) => n,
        }
    }
}
