//! Flow control of a running consumer: [`RunningConsumer::pause`], [`resume`], [`scale_to`],
//! [`set_prefetch`] and [`drain`]; the consumer thread carries them out (`lifecycle.rs`).
//!
//! Each of `pause`, `scale_to` and `set_prefetch` ends the current subscription exactly as a
//! close does (`owner.rs` `shutdown`: `basic.cancel`, what was received and not started given
//! back without spending RabbitMQ 4.x's delivery limit, running handlers finished and settled
//! up to the shutdown timeout) but keeps the consumer: its thread's loop (`lifecycle.rs`) then
//! waits for a resume, or subscribes again at once with the new concurrency or prefetch. So no
//! delivery is lost or handled twice by flow control, an ordering key's order holds across it
//! (nothing of the old subscription is still running when the new one starts, except a handler
//! past the shutdown timeout, whose delivery was given back), and a change of prefetch or
//! concurrency never resizes a channel the threads share while they run.
//!
//! [`resume`]: RunningConsumer::resume
//! [`scale_to`]: RunningConsumer::scale_to
//! [`set_prefetch`]: RunningConsumer::set_prefetch
//! [`drain`]: RunningConsumer::drain

pub(in crate::consume) mod control;
pub(in crate::consume) mod lifecycle;

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::report::CloseReport;
use super::running::RunningConsumer;
use crate::error::{Error, Result};
use control::Control;

/// The most worker threads [`RunningConsumer::scale_to`] accepts (as many as a prefetch can
/// keep busy).
const MAX_CONCURRENCY: usize = u16::MAX as usize;

impl RunningConsumer {
    /// Stops taking deliveries without closing the consumer: `basic.cancel`, what was received
    /// and not started goes back to the queue (without spending RabbitMQ 4.x's delivery limit,
    /// as a close does), running handlers finish and are settled, up to the shutdown timeout;
    /// the channel closes, the threads wait for [`resume`](Self::resume). Returns once that is
    /// done, with what the subscription's end did (`requeued`, `finished_in_time`,
    /// `abandoned`); pausing a paused consumer does nothing (an empty report).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the consumer has ended.
    pub fn pause(&self) -> Result<CloseReport> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.control(Control::Pause(tx))?;
        rx.recv().map_err(|_| closed())
    }

    /// Subscribes again after [`pause`](Self::pause), and returns once subscribed (while the
    /// connection is down, once it is back and the consumer subscribed, as after a reconnect).
    /// A consumer that is not paused returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the consumer has ended (or is closed while this waits).
    pub fn resume(&self) -> Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.control(Control::Resume(tx))?;
        rx.recv().map_err(|_| closed())?
    }

    /// True between [`pause`](Self::pause) and [`resume`](Self::resume).
    pub fn is_paused(&self) -> bool {
        self.context().paused.load(Ordering::SeqCst)
    }

    /// Runs `concurrency` worker threads from now on: the subscription ends as for
    /// [`pause`](Self::pause) (nothing lost, nothing handled twice, running handlers finish)
    /// and starts again at once with the new number; returns once subscribed again. On a
    /// paused consumer it changes what [`resume`](Self::resume) starts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0, more than 65535, or other than 1 for an
    /// [`inline`](super::ConsumerOptions::inline) consumer; [`Error::Closed`] when the consumer
    /// has ended.
    pub fn scale_to(&self, concurrency: usize) -> Result<()> {
        let ctx = self.context();
        if concurrency == 0 || concurrency > MAX_CONCURRENCY {
            return Err(Error::invalid(format!(
                "concurrency must be from 1 to {MAX_CONCURRENCY}, not {concurrency}"
            )));
        }
        if ctx.inline && concurrency != 1 {
            return Err(Error::invalid(
                "an inline consumer runs its handler on its own thread: its concurrency is 1",
            ));
        }
        self.rescale(concurrency, ctx.prefetch())
    }

    /// Subscribes with prefetch `prefetch` from now on, as [`scale_to`](Self::scale_to) does
    /// with the concurrency.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; [`Error::Closed`] when the consumer has ended.
    pub fn set_prefetch(&self, prefetch: u16) -> Result<()> {
        if prefetch == 0 {
            return Err(Error::invalid(
                "prefetch must be at least 1: an unlimited prefetch lets the client buffer without \
                 bound",
            ));
        }
        self.rescale(self.context().concurrency(), prefetch)
    }

    /// Closes as [`close`](Self::close) does, waiting up to `timeout` (instead of the options'
    /// shutdown timeout) for running handlers: what is still running then is given back and
    /// counted `abandoned` in the report.
    ///
    /// # Errors
    ///
    /// As [`close`](Self::close).
    pub fn drain(self, timeout: Duration) -> Result<CloseReport> {
        self.set_shutdown_timeout(timeout);
        self.close()
    }

    /// From now on, a close waits up to `timeout` for running handlers (a consumer group's
    /// drain sets it on every member before closing them together).
    pub(crate) fn set_shutdown_timeout(&self, timeout: Duration) {
        *self.context().shutdown_timeout_now.lock() = timeout;
    }

    fn rescale(&self, concurrency: usize, prefetch: u16) -> Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.control(Control::Scale {
            concurrency,
            prefetch,
            reply: tx,
        })?;
        rx.recv().map_err(|_| closed())?
    }
}

fn closed() -> Error {
    Error::Closed { what: "consumer" }
}
