//! The batcher: bounded intake from a source, batches on one worker thread, outcomes in order.

use crate::StopHandle;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::Scope;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::error::{panic_message, Error, Result};

/// What [`Source::poll`] found.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Polled<I> {
    /// The next item.
    Item(I),
    /// Nothing arrived within the timeout; ask again later.
    Idle,
    /// The source is exhausted: there will be no more items.
    End,
}

/// Where the batcher takes its items from (for the acknowledged consumer: deliveries).
///
/// Runs on the caller's thread only; it need not be `Send`.
pub trait Source {
    /// What it yields, such as a [`Delivery`](super::Delivery).
    type Item;

    /// Waits at most `timeout` for the next item.
    ///
    /// Returns [`Polled::Idle`] if nothing came in time, so that the caller can notice a stop
    /// request while the source is idle. With `Duration::ZERO` it must not block: it returns an
    /// item only if one is ready. [`Polled::End`] means there will be no more; the source is not
    /// polled again after it.
    ///
    /// # Errors
    ///
    /// An error stops the intake; the batcher finishes the items it has taken, closes the source
    /// and returns the error.
    fn poll(&mut self, timeout: Duration) -> Result<Polled<Self::Item>>;

    /// Releases what the source holds (cancels a broker consumer, closes a file). Called exactly
    /// once by the batcher, after the last batch was handed back, on every exit path.
    ///
    /// Defaults to doing nothing.
    ///
    /// # Errors
    ///
    /// Returned by the batcher unless an earlier error is returned instead.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

impl<S: Source + ?Sized> Source for &mut S {
    type Item = S::Item;
    fn poll(&mut self, timeout: Duration) -> Result<Polled<S::Item>> {
        (**self).poll(timeout)
    }
    fn close(&mut self) -> Result<()> {
        (**self).close()
    }
}

impl<S: Source + ?Sized> Source for Box<S> {
    type Item = S::Item;
    fn poll(&mut self, timeout: Duration) -> Result<Polled<S::Item>> {
        (**self).poll(timeout)
    }
    fn close(&mut self) -> Result<()> {
        (**self).close()
    }
}

/// A [`Source`] over an iterator: each item is ready at once, the iterator's end is
/// [`Polled::End`].
#[derive(Clone, Debug)]
pub struct IterSource<It> {
    items: It,
}

impl<It: Iterator> IterSource<It> {
    /// A source yielding `items` in order.
    pub fn new<T: IntoIterator<IntoIter = It>>(items: T) -> IterSource<It> {
        IterSource {
            items: items.into_iter(),
        }
    }
}

impl<It: Iterator> Source for IterSource<It> {
    type Item = It::Item;
    fn poll(&mut self, _timeout: Duration) -> Result<Polled<It::Item>> {
        Ok(self.items.next().map_or(Polled::End, Polled::Item))
    }
}

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
/// use acemq_amqp::patterns::acknowledged::{Batcher, IterSource};
/// # fn main() -> acemq_amqp::Result<()> {
/// let batcher = Batcher::builder().batch_size(4).max_pending(8).build()?;
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
    batch_size: usize,
    max_pending: usize,
    poll_interval: Duration,
    stop: StopHandle,
}

/// Builds a [`Batcher`].
#[derive(Clone, Debug)]
pub struct BatcherBuilder {
    batch_size: usize,
    max_pending: Option<usize>,
    poll_interval: Duration,
    stop: StopHandle,
}

impl Default for BatcherBuilder {
    fn default() -> Self {
        BatcherBuilder {
            batch_size: 32,
            max_pending: None,
            poll_interval: Duration::from_millis(100),
            stop: StopHandle::new(),
        }
    }
}

impl BatcherBuilder {
    /// The largest batch. Defaults to 32.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// The most items taken from the source and not yet handed back. Defaults to twice the
    /// batch size.
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = Some(n);
        self
    }

    /// The longest a single [`Source::poll`] waits while nothing is in progress, and so how
    /// soon a stop is noticed on an idle source. Defaults to 100 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Uses this stop handle (for example one shared by several batchers). Defaults to a new
    /// one, available from [`Batcher::stop_handle`].
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }

    /// Checks the settings and builds the batcher.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the batch size or `max_pending` is zero, or the poll
    /// interval is shorter than 1 ms.
    pub fn build(self) -> Result<Batcher> {
        let max_pending = self
            .max_pending
            .unwrap_or_else(|| self.batch_size.saturating_mul(2));
        if self.batch_size == 0 {
            return Err(Error::invalid("batch_size must be at least 1"));
        }
        if max_pending == 0 {
            return Err(Error::invalid("max_pending must be at least 1"));
        }
        if self.poll_interval < Duration::from_millis(1) {
            return Err(Error::invalid("poll_interval must be at least 1 ms"));
        }
        Ok(Batcher {
            batch_size: self.batch_size,
            max_pending,
            poll_interval: self.poll_interval,
            stop: self.stop,
        })
    }
}

/// What the worker sends back: the batch and its outcomes (or why it failed).
type Done<I, O> = (Vec<I>, Result<Vec<O>>);

impl Batcher {
    /// A builder with the defaults.
    pub fn builder() -> BatcherBuilder {
        BatcherBuilder::default()
    }

    /// A batcher with this batch size and intake bound, and the other defaults.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if either is zero.
    pub fn new(batch_size: usize, max_pending: usize) -> Result<Batcher> {
        Batcher::builder()
            .batch_size(batch_size)
            .max_pending(max_pending)
            .build()
    }

    /// The largest batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The most items taken and not yet handed back.
    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// The longest single poll of an idle source.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

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
        let run = std::thread::scope(|scope| self.drive(scope, &mut source, work, &mut on_batch));
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

    /// One run: starts the worker, then repeats *hand back what the worker finished → notice a
    /// stop → take the [next step](Run::next_step)* until the run is over.
    fn drive<'scope, 'env, S, O, W, Y>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        source: &mut Closing<S>,
        work: W,
        on_batch: &mut Y,
    ) -> Result<()>
    where
        S: Source,
        S::Item: Send + 'scope,
        O: Send + 'scope,
        W: FnMut(&[S::Item]) -> Result<Vec<O>> + Send + 'scope,
        Y: FnMut(Vec<S::Item>, Result<Vec<O>>) -> Result<()>,
    {
        if self.stop.is_stopped() {
            return Ok(());
        }
        let mut run = self.start_worker(scope, work, on_batch)?;
        loop {
            run.hand_back_finished();
            if self.stop.is_stopped() {
                run.intake_open = false;
            }
            match run.next_step() {
                Step::Dispatch => run.dispatch()?,
                Step::WaitForWorker => run.wait()?,
                Step::Poll { timeout } => {
                    let polled = source.source.poll(timeout);
                    run.take(polled)?;
                }
                Step::Finished => break,
            }
        }
        // Dropping `run` closes the worker's channel; the scope joins the worker.
        match run.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Spawns the worker thread (`acemq-ack-worker`) in `scope` and returns the caller's side.
    fn start_worker<'scope, 'env, 'y, I, O, W, Y>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        work: W,
        on_batch: &'y mut Y,
    ) -> Result<Run<'y, I, O, Y>>
    where
        I: Send + 'scope,
        O: Send + 'scope,
        W: FnMut(&[I]) -> Result<Vec<O>> + Send + 'scope,
    {
        let (to_worker, batches) = bounded::<Vec<I>>(1);
        let (done_tx, done) = bounded::<Done<I, O>>(2);
        std::thread::Builder::new()
            .name("acemq-ack-worker".into())
            .spawn_scoped(scope, move || worker(batches, done_tx, work))
            .map_err(|source| Error::Io {
                context: "starting the batch worker thread".into(),
                source,
            })?;
        Ok(Run {
            on_batch,
            to_worker,
            done,
            batch_size: self.batch_size,
            max_pending: self.max_pending,
            poll_interval: self.poll_interval,
            current: Vec::with_capacity(self.batch_size.min(self.max_pending)),
            pending: 0,
            in_flight: 0,
            intake_open: true,
            handing_back: true,
            error: None,
        })
    }
}

/// What a run does next, decided from its state alone by [`Run::next_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Send the batch being formed to the worker.
    Dispatch,
    /// Wait (up to the poll interval) for the worker to finish a batch.
    WaitForWorker,
    /// Ask the source for an item, waiting at most `timeout`.
    Poll { timeout: Duration },
    /// Intake closed, nothing with the worker, nothing being formed: the run is over.
    Finished,
}

/// The most batches with the worker at a time: one running, one queued behind it.
const MAX_IN_FLIGHT: usize = 2;

/// The caller's side of one run.
struct Run<'y, I, O, Y> {
    on_batch: &'y mut Y,
    to_worker: Sender<Vec<I>>,
    done: Receiver<Done<I, O>>,
    batch_size: usize,
    max_pending: usize,
    poll_interval: Duration,
    /// The batch being formed.
    current: Vec<I>,
    /// Items taken from the source and not yet handed back (or dropped).
    pending: usize,
    /// Batches sent to the worker and not yet received back.
    in_flight: usize,
    /// Whether the source may still be polled.
    intake_open: bool,
    /// False after the callback failed: outcomes are no longer handed back.
    handing_back: bool,
    /// The first error, returned at the end.
    error: Option<Error>,
}

impl<I, O, Y> Run<'_, I, O, Y>
where
    Y: FnMut(Vec<I>, Result<Vec<O>>) -> Result<()>,
{
    /// What to do next:
    ///
    /// 1. a batch that is full, or the last one once intake has closed, goes to the worker if
    ///    it has room;
    /// 2. once intake has closed, wait for the worker until it has nothing left;
    /// 3. at the intake bound (or with a full batch the worker has no room for), dispatch what
    ///    is being formed if the worker has room, else wait for it;
    /// 4. otherwise poll the source: waiting up to the poll interval when there is nothing else
    ///    to do, without waiting while a batch is being formed or the worker is busy.
    fn next_step(&self) -> Step {
        let worker_has_room = self.in_flight < MAX_IN_FLIGHT;
        let forming = !self.current.is_empty();
        let full = self.current.len() >= self.batch_size;
        if forming && worker_has_room && (full || !self.intake_open) {
            return Step::Dispatch;
        }
        if !self.intake_open {
            return if self.in_flight == 0 && !forming {
                Step::Finished
            } else {
                Step::WaitForWorker
            };
        }
        if self.pending >= self.max_pending || full {
            return if forming && worker_has_room {
                Step::Dispatch
            } else {
                Step::WaitForWorker
            };
        }
        let timeout = if !forming && self.worker_idle() {
            self.poll_interval
        } else {
            Duration::ZERO
        };
        Step::Poll { timeout }
    }

    fn worker_idle(&self) -> bool {
        self.in_flight == 0
    }

    /// Takes what the source answered: an item joins the batch being formed; `Idle` sends a
    /// partial batch to an idle worker (so batches stay small when traffic is light) or else
    /// waits for the busy one; `End` or an error closes the intake (the error is kept).
    fn take(&mut self, polled: Result<Polled<I>>) -> Result<()> {
        match polled {
            Ok(Polled::Item(item)) => {
                self.current.push(item);
                self.pending += 1;
            }
            Ok(Polled::Idle) if self.worker_idle() => {
                if !self.current.is_empty() {
                    self.dispatch()?;
                }
            }
            Ok(Polled::Idle) => self.wait()?,
            Ok(Polled::End) => self.intake_open = false,
            Err(e) => {
                self.intake_open = false;
                self.fail(e);
            }
        }
        Ok(())
    }

    /// Sends the batch being formed to the worker.
    fn dispatch(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.current);
        self.to_worker.send(batch).map_err(|_| Error::Closed {
            what: "batch worker",
        })?;
        self.in_flight += 1;
        Ok(())
    }

    /// Hands back every batch the worker has finished, without waiting.
    fn hand_back_finished(&mut self) {
        while let Ok(finished) = self.done.try_recv() {
            self.finish(finished);
        }
    }

    /// Waits up to the poll interval for a finished batch, and hands it back.
    fn wait(&mut self) -> Result<()> {
        if self.in_flight == 0 {
            return Ok(());
        }
        match self.done.recv_timeout(self.poll_interval) {
            Ok(finished) => {
                self.finish(finished);
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => Ok(()),
            // The worker catches panics, so it only goes away when told to.
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed {
                what: "batch worker",
            }),
        }
    }

    /// Hands one finished batch to the callback. When the callback fails, intake closes and
    /// nothing more is handed back or dispatched: the batch being formed is dropped unapplied.
    fn finish(&mut self, (items, outcomes): Done<I, O>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let n = items.len();
        if self.handing_back {
            if let Err(e) = (self.on_batch)(items, outcomes) {
                self.handing_back = false;
                self.intake_open = false;
                self.current.clear();
                self.fail(e);
            }
        }
        self.pending = self.pending.saturating_sub(n);
    }

    fn fail(&mut self, e: Error) {
        match &self.error {
            None => self.error = Some(e),
            Some(first) => log::warn!("batcher: {e} (after an earlier error: {first})"),
        }
    }
}

/// The worker thread: runs each batch, catching panics, and sends it back with its outcomes.
fn worker<I, O, W>(batches: Receiver<Vec<I>>, done: Sender<Done<I, O>>, mut work: W)
where
    W: FnMut(&[I]) -> Result<Vec<O>>,
{
    for batch in batches.iter() {
        let outcomes = match catch_unwind(AssertUnwindSafe(|| work(&batch))) {
            Ok(Ok(outcomes)) if outcomes.len() == batch.len() => Ok(outcomes),
            Ok(Ok(outcomes)) => Err(Error::invalid(format!(
                "the batch work returned {} outcomes for {} items",
                outcomes.len(),
                batch.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(panic) => Err(Error::Handler {
                source: format!("the batch work panicked: {}", panic_message(&*panic)).into(),
            }),
        };
        if done.send((batch, outcomes)).is_err() {
            break;
        }
    }
}

/// Closes the source exactly once: explicitly, or when dropped (during a panic).
struct Closing<S: Source> {
    source: S,
    closed: bool,
}

impl<S: Source> Closing<S> {
    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.source.close()
    }
}

impl<S: Source> Drop for Closing<S> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            log::warn!("closing the source failed: {e}");
        }
    }
}
