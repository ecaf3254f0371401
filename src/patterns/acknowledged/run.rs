//! One run of the batcher: the worker thread, and the caller's side that polls the source,
//! forms batches, dispatches them and hands their outcomes back.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::Scope;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::source::{Polled, Source};
use crate::error::{panic_message, Error, Result};
use crate::StopHandle;

/// The validated limits of a batcher's runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// The largest batch.
    pub(super) batch_size: usize,
    /// The most items taken and not yet handed back.
    pub(super) max_pending: usize,
    /// The longest single poll of an idle source.
    pub(super) poll_interval: Duration,
}

/// What the worker sends back: the batch and its outcomes (or why it failed).
type Done<I, O> = (Vec<I>, Result<Vec<O>>);

/// One run: starts the worker, then repeats *hand back what the worker finished → notice a
/// stop → take the [next step](Run::next_step)* until the run is over.
pub(super) fn drive<'scope, 'env, S, O, W, Y>(
    limits: &Limits,
    stop: &StopHandle,
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
    if stop.is_stopped() {
        return Ok(());
    }
    let mut run = start_worker(limits, scope, work, on_batch)?;
    loop {
        run.hand_back_finished();
        if stop.is_stopped() {
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
    limits: &Limits,
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
        batch_size: limits.batch_size,
        max_pending: limits.max_pending,
        poll_interval: limits.poll_interval,
        current: Vec::with_capacity(limits.batch_size.min(limits.max_pending)),
        pending: 0,
        in_flight: 0,
        intake_open: true,
        handing_back: true,
        error: None,
    })
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
pub(super) struct Closing<S: Source> {
    pub(super) source: S,
    pub(super) closed: bool,
}

impl<S: Source> Closing<S> {
    pub(super) fn close(&mut self) -> Result<()> {
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
