//! Where a stream reader is: the offsets whose handler is running and the offset after the last
//! one finished, so that a reader subscribing again (after a reconnect) starts where nothing is
//! missed. The reader's consumer keeps it through its [`DeliveryHook`] ([`ReaderHook`]): a
//! delivery's offset is started before its handler, finished once its copy (if any) is
//! confirmed, and read by the owner before each `basic.consume`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::consume::DeliveryHook;
use crate::envelope::{HeaderValue, Message};

/// The header RabbitMQ stamps on every stream delivery: its offset in the log.
pub(super) const STREAM_OFFSET: &str = "x-stream-offset";

/// A stream reader's position. Shared by its workers and its owner thread.
#[derive(Debug, Default)]
pub(super) struct StreamCursor {
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
pub(super) fn offset_of(message: &Message) -> Option<u64> {
    match message.headers.get(STREAM_OFFSET)? {
        HeaderValue::Int(i) => u64::try_from(*i).ok(),
        HeaderValue::Text(t) => t.parse().ok(),
        _ => None,
    }
}

impl StreamCursor {
    /// A handler starts on `message`; its offset, when it has one.
    pub(super) fn started(&self, message: &Message) -> Option<u64> {
        let offset = offset_of(message)?;
        self.state.lock().running.insert(offset);
        Some(offset)
    }

    /// The message at `offset` is done with (handled; its copy, if any, confirmed).
    pub(super) fn finished(&self, offset: u64) {
        let mut s = self.state.lock();
        s.running.remove(&offset);
        let after = offset.saturating_add(1);
        if s.next.is_none_or(|n| n < after) {
            s.next = Some(after);
        }
    }

    /// Where to start again so that nothing is missed: the lowest offset still running, else one
    /// past the last finished; `None` before anything was read.
    pub(super) fn resume_at(&self) -> Option<u64> {
        let s = self.state.lock();
        match (s.running.first(), s.next) {
            (Some(r), Some(n)) => Some((*r).min(n)),
            (Some(r), None) => Some(*r),
            (None, n) => n,
        }
    }
}

/// A stream reader's part in its consumer's deliveries: the position kept in `cursor`, the
/// reader's name on its threads.
#[derive(Debug)]
pub(super) struct ReaderHook {
    pub(super) cursor: Arc<StreamCursor>,
    pub(super) name: Option<String>,
}

impl DeliveryHook for ReaderHook {
    fn label(&self) -> Option<String> {
        self.name.clone()
    }

    /// Subscribing again (after a reconnect) goes on where the reader was, not from the offset
    /// it first asked for.
    fn on_subscribe(&self, arguments: &mut BTreeMap<String, HeaderValue>) {
        if let Some(next) = self.cursor.resume_at() {
            let next = i64::try_from(next).unwrap_or(i64::MAX);
            arguments.insert(STREAM_OFFSET.into(), HeaderValue::Int(next));
        }
    }

    fn before_handler(&self, message: &Message) {
        self.cursor.started(message);
    }

    /// Handled and its copy (if any) confirmed: a resumed reader starts after it.
    fn done(&self, message: &Message) {
        if let Some(offset) = offset_of(message) {
            self.cursor.finished(offset);
        }
    }
}
