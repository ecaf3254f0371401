//! [`StopHandle`]: the one way to ask something running (a consumer, a batcher, a responder, a
//! stream reader) to stop from another thread.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;

/// Asks what it was taken from (a [`RunningConsumer`](crate::RunningConsumer), a
/// [`Consumer`](crate::Consumer) running on the caller's thread, an acknowledged consumer's
/// `Batcher`, a responder, a stream reader) to stop, from any thread. `Clone + Send + Sync`; all
/// clones control the same thing. Returns at once; stopping twice is harmless, and stopping is
/// final.
#[derive(Clone)]
pub struct StopHandle {
    stopped: Arc<AtomicBool>,
    wake: Option<Sender<()>>,
}

impl Default for StopHandle {
    fn default() -> Self {
        StopHandle::new()
    }
}

impl StopHandle {
    /// A handle that is not stopped, to give to what takes one (a `Batcher`'s options).
    pub fn new() -> StopHandle {
        StopHandle {
            stopped: Arc::new(AtomicBool::new(false)),
            wake: None,
        }
    }

    /// A handle setting `stopped` and waking the thread reading `wake`'s receiver.
    pub(crate) fn with_waker(stopped: Arc<AtomicBool>, wake: Sender<()>) -> StopHandle {
        StopHandle {
            stopped,
            wake: Some(wake),
        }
    }

    /// Asks to stop; returns at once. Stopping twice is harmless.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }

    /// True once [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}
