//! The batcher: bounded intake from a source, batches on one worker thread, outcomes in order.

use std::sync::Arc;
use std::time::Duration;

use super::run::{drive, Closing, Limits};
use super::source::Source;
use crate::error::{Error, Result};
use crate::StopHandle;

/// Takes items from a [`Source`], runs them in batches on one worker thread, and hands back one
/// outcome per item, in order.
///
/// * **Batches.** Up to `batch_size` items. A batch is dispatched when it is full, or when the
///   worker is free and the source has nothing ready (so batches grow with the load). At most
///   two batches are with the worker at a time: one running, one queued.
/// * **Bounded intake.** At most `max_pending` items are taken from the source and not yet
///   handed back: an item counts from the moment it is polled until the callback that receives
///   its outcome returns. (A `max_pending` below `batch_size` also caps the batches.)
/// * **Stopping.** On a source error, a [`StopHandle::stop`], or the end of the source, it
///   stops taking items, lets the worker finish everything taken and hands back every outcome.
///   When the callback returns an error it stops taking items, lets the worker finish the
///   batches it has (their outcomes are not handed back), drops the items not yet dispatched
///   and stops calling the callback. Then the source is closed, the worker thread joined, and
///   the first error (if any) returned.
///
/// Each run starts its own worker thread (`acemq-ack-worker`) inside a thread scope, so the
/// work may borrow from the caller; the source and the callback stay on the caller's thread.
///
/// # Example
///
/// ```
/// use acemq_amqp::patterns::acknowledged::{Batcher, BatcherOptions, IterSource};
/// # fn main() -> acemq_amqp::Result<()> {
/// let batcher = Batcher::new(BatcherOptions::new().batch_size(4).max_pending(8))?;
/// let mut out = Vec::new();
/// batcher.map_outcomes(
///     IterSource::new(1..=10),
///     |batch: &[i32]| Ok(batch.iter().map(|n| n * n).collect()),
///     |n, square| {
///         if let Ok(square) = square {
///             out.push((n, square));
///         }
///         Ok(())
///     },
/// )?;
/// assert_eq!(out[9], (10, 100));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Batcher {
    limits: Limits,
    stop: StopHandle,
}

/// How a [`Batcher`] batches: the largest batch, the intake bound, the poll interval and the
/// stop handle. Validated by [`Batcher::new`].
///
/// ```
/// use acemq_amqp::patterns::acknowledged::BatcherOptions;
/// use std::time::Duration;
/// let options = BatcherOptions::new()
///     .batch_size(32)
///     .max_pending(64)
///     .poll_interval(Duration::from_millis(50));
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct BatcherOptions {
    batch_size: usize,
    max_pending: Option<usize>,
    poll_interval: Duration,
    stop: StopHandle,
}

impl Default for BatcherOptions {
    fn default() -> Self {
        BatcherOptions {
            batch_size: 32,
            max_pending: None,
            poll_interval: Duration::from_millis(100),
            stop: StopHandle::new(),
        }
    }
}

impl BatcherOptions {
    /// Every check of these options, in one place (run by [`Batcher::new`]); the most pending.
    fn validate(&self) -> Result<usize> {
        let max_pending = self
            .max_pending
            .unwrap_or_else(|| self.batch_size.saturating_mul(2));
        if self.batch_size == 0 {
            return Err(Error::invalid(format!(
                "batch_size must be at least 1 (got {})",
                self.batch_size
            )));
        }
        if max_pending == 0 {
            return Err(Error::invalid(format!(
                "max_pending must be at least 1 (got {max_pending})"
            )));
        }
        if self.poll_interval < Duration::from_millis(1) {
            return Err(Error::invalid(format!(
                "poll_interval must be at least 1 ms (got {:?})",
                self.poll_interval
            )));
        }
        Ok(max_pending)
    }

    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest batch. Defaults to 32; must be at least 1.
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// The most items taken from the source and not yet handed back. Defaults to twice the
    /// batch size; must be at least 1.
    #[must_use]
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = Some(n);
        self
    }

    /// The longest a single [`Source::poll`] waits while nothing is in progress, and so how
    /// soon a stop is noticed on an idle source. Defaults to 100 ms; must be at least 1 ms.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Uses this stop handle (for example one shared by several batchers). Defaults to a new
    /// one, available from [`Batcher::stop_handle`].
    #[must_use]
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }
}

impl Batcher {
    /// A batcher with these options. Starts no thread: each run starts its own worker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the batch size or `max_pending` is zero, or the poll
    /// interval is shorter than 1 ms.
    pub fn new(options: BatcherOptions) -> Result<Batcher> {
        let max_pending = options.validate()?;
        Ok(Batcher {
            limits: Limits {
                batch_size: options.batch_size,
                max_pending,
                poll_interval: options.poll_interval,
            },
            stop: options.stop,
        })
    }

    /// The largest batch.
    pub fn batch_size(&self) -> usize {
        self.limits.batch_size
    }

    /// The most items taken and not yet handed back.
    pub fn max_pending(&self) -> usize {
        self.limits.max_pending
    }

    /// The longest single poll of an idle source.
    pub fn poll_interval(&self) -> Duration {
        self.limits.poll_interval
    }

    /// A handle that stops this batcher from any thread.
    /// A handle that stops this batcher from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Runs `source` through `work` in batches and hands each item back with its outcome, in
    /// the order the items were taken.
    ///
    /// `work` runs on the worker thread and returns one outcome per item of the batch, or an
    /// error for the whole batch; a panic in it, or a wrong number of outcomes, fails the batch
    /// too. A failed batch hands each of its items back with the same shared error.
    /// `on_outcome` runs on the caller's thread; an error from it stops the run (see
    /// [`Batcher`]).
    ///
    /// # Errors
    ///
    /// The first error of the source, of `on_outcome`, or of closing the source; or
    /// [`Error::Io`] if the worker thread cannot be started.
    pub fn map_outcomes<S, O, W, Y>(&self, source: S, work: W, mut on_outcome: Y) -> Result<()>
    where
        S: Source,
        S::Item: Send,
        O: Send,
        W: FnMut(&[S::Item]) -> Result<Vec<O>> + Send,
        Y: FnMut(S::Item, Result<O, Arc<Error>>) -> Result<()>,
    {
        self.run_batches(source, work, |items, outcomes| match outcomes {
            Ok(outcomes) => items
                .into_iter()
                .zip(outcomes)
                .try_for_each(|(item, outcome)| on_outcome(item, Ok(outcome))),
            Err(e) => {
                let e = Arc::new(e);
                items
                    .into_iter()
                    .try_for_each(|item| on_outcome(item, Err(Arc::clone(&e))))
            }
        })
    }

    /// Like [`map_outcomes`](Self::map_outcomes), but hands back a whole batch at a time: its
    /// items, in order, with their outcomes or the batch's error. Outcomes are checked to be as
    /// many as the items.
    ///
    /// # Errors
    ///
    /// As for [`map_outcomes`](Self::map_outcomes).
    pub fn run_batches<S, O, W, Y>(&self, source: S, work: W, mut on_batch: Y) -> Result<()>
    where
        S: Source,
        S::Item: Send,
        O: Send,
        W: FnMut(&[S::Item]) -> Result<Vec<O>> + Send,
        Y: FnMut(Vec<S::Item>, Result<Vec<O>>) -> Result<()>,
    {
        let mut source = Closing {
            source,
            closed: false,
        };
        let run = std::thread::scope(|scope| {
            drive(
                &self.limits,
                &self.stop,
                scope,
                &mut source,
                work,
                &mut on_batch,
            )
        });
        let closed = source.close();
        match (run, closed) {
            (Err(e), Err(c)) => {
                log::warn!("closing the source after an error failed too: {c}");
                Err(e)
            }
            (Err(e), Ok(())) => Err(e),
            (Ok(()), closed) => closed,
        }
    }
}
