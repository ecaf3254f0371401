//! The deadline layer: a [`Deadline`] makes [`TimeLimited`] wrappers; overruns leave orphans.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::layer::{Layer, Ran};
use super::orphans;
use crate::consume::{format_duration, Handler, HandlerResult, OrderBy, Outcome};
use crate::envelope::Message;
use crate::error::{Error, Result};
use crate::observe::{LogObserver, Observer, Overrun};

/// The deadline layer: [`Deadline::new(limit, ..)`](Deadline::new) with the default options.
/// Build a [`Deadline`] to count its orphans or give it an observer, and turn it into a layer
/// with [`Deadline::layer`].
///
/// # Errors
///
/// [`Error::InvalidArgument`] for a limit under 1 ms.
pub fn with_timeout(limit: Duration) -> Result<Layer> {
    Ok(Deadline::new(limit, DeadlineOptions::default())?.layer())
}

/// Orphaned handler threads of a [`TimeLimited`] wrapper, shared with it: take it with
/// [`Deadline::orphans`] before the wrapper moves into a consumer.
#[derive(Clone, Debug, Default)]
pub struct OrphanCount(Arc<Orphans>);

#[derive(Debug, Default)]
struct Orphans {
    running: AtomicUsize,
    total: AtomicU64,
}

impl OrphanCount {
    /// Orphaned handler threads still running now.
    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    /// Handlers that overran their deadline so far.
    pub fn total(&self) -> u64 {
        self.0.total.load(Ordering::SeqCst)
    }
}

/// How a [`Deadline`] is set up: how many orphaned threads at most, and where overruns are
/// reported.
#[must_use]
pub struct DeadlineOptions {
    max_orphans: usize,
    observer: Arc<dyn Observer>,
}

impl Default for DeadlineOptions {
    fn default() -> Self {
        DeadlineOptions {
            max_orphans: 16,
            observer: Arc::new(LogObserver),
        }
    }
}

impl std::fmt::Debug for DeadlineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineOptions")
            .field("max_orphans", &self.max_orphans)
            .finish_non_exhaustive()
    }
}

impl DeadlineOptions {
    /// Every check of these options, in one place (run by [`Deadline::new`]).
    fn validate(&self) -> Result<()> {
        if self.max_orphans == 0 {
            return Err(Error::invalid(
                "the deadline's max_orphans must be at least 1 (got 0)",
            ));
        }
        Ok(())
    }

    /// While this many orphaned handler threads (still running past their deadline) run, a new
    /// message is settled as a retry without starting. Handlers already running may still
    /// overrun, so with `c` running at once up to `max_orphans + c − 1` orphans can exist (see
    /// the [module docs](crate::patterns::chain#with_timeout-what-a-deadline-can-and-cannot-do)).
    /// At least 1. Defaults to 16.
    pub fn max_orphans(mut self, max: usize) -> Self {
        self.max_orphans = max;
        self
    }

    /// Where overruns are reported ([`Observer::overrun`]); give it the connection's observer.
    /// Defaults to [`LogObserver`] (a warning).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = crate::observe::Guarded::wrap(observer);
        self
    }
}

/// A deadline for a handler: how long, how many orphaned threads at most, and where overruns
/// are reported. Make the wrapper with [`around`](Self::around) or the chain layer with
/// [`layer`](Self::layer).
pub struct Deadline {
    limit: Duration,
    max_orphans: usize,
    observer: Arc<dyn Observer>,
    orphans: OrphanCount,
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline")
            .field("limit", &self.limit)
            .field("max_orphans", &self.max_orphans)
            .field("orphans", &self.orphans)
            .finish()
    }
}

impl Deadline {
    /// A deadline of `limit` (at least 1 ms) set up by `options`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a limit under 1 ms or a `max_orphans` of 0.
    pub fn new(limit: Duration, options: DeadlineOptions) -> Result<Deadline> {
        if limit < Duration::from_millis(1) {
            return Err(Error::invalid(format!(
                "the deadline's limit must be at least 1 ms (got {limit:?})"
            )));
        }
        options.validate()?;
        Ok(Deadline {
            limit,
            max_orphans: options.max_orphans,
            observer: options.observer,
            orphans: OrphanCount::default(),
        })
    }

    /// The count of orphaned threads (a shared handle: it goes on counting after the wrapper
    /// moved into a consumer).
    pub fn orphans(&self) -> OrphanCount {
        self.orphans.clone()
    }

    /// This deadline around `handler`.
    pub fn around<H>(self, handler: H) -> TimeLimited<H> {
        TimeLimited {
            handler: Arc::new(handler),
            deadline: self,
        }
    }

    /// This deadline as a [`chain`](fn@crate::patterns::chain::chain) layer.
    pub fn layer(self) -> Layer {
        Layer::new(move |inner| Box::new(self.around(inner)))
    }
}

/// A handler with a deadline, made by [`Deadline::around`] (see the
/// [module docs](crate::patterns::chain#with_timeout-what-a-deadline-can-and-cannot-do)).
pub struct TimeLimited<H> {
    handler: Arc<H>,
    deadline: Deadline,
}

impl<H> std::fmt::Debug for TimeLimited<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimeLimited")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// What a deadline thread hands back: the handler's results, and the orphans of deadlines
/// further in that it saw (see [`orphans`]).
type Finished<T> = (T, Vec<Arc<orphans::End>>);

/// How waiting for a deadline thread ended.
enum Waited<T> {
    Done(T),
    /// Past the limit: the orphans running now, and the overruns so far.
    Overran(usize, u64),
    NotStarted(std::io::Error),
}

impl<H> TimeLimited<H> {
    /// `None` to start, or the retry of a message not started because too many orphans run.
    fn refused(&self, what: &str) -> Option<Outcome> {
        let Deadline {
            limit, max_orphans, ..
        } = &self.deadline;
        let running = self.deadline.orphans.running();
        if running < *max_orphans {
            return None;
        }
        log::warn!(
            "acemq: {what} not started: {running} handlers are still running past their \
             deadline of {limit:?} (at most {max_orphans})"
        );
        Some(Outcome::retry(format!(
            "acemq: not started: {running} handlers are still running past their deadline"
        )))
    }

    /// Runs `work` on a thread of its own and waits up to the limit. One that overruns runs
    /// on as an orphan, and is reported to the idempotency layer around this one, if any
    /// ([`orphans::overran`]), with each message's accept or not (`accepted`) when it ends.
    fn run<T, W, A>(&self, what: String, work: W, accepted: A) -> Waited<T>
    where
        T: Send + 'static,
        W: FnOnce() -> T + Send + 'static,
        A: FnOnce(&T) -> Vec<bool> + Send + 'static,
    {
        let orphans = &self.deadline.orphans;
        let (tx, rx) = crossbeam_channel::bounded::<Finished<T>>(1);
        // Set under its lock by whichever side comes second: the waiter giving up, or the
        // handler's thread finishing after that (then it counts itself out).
        let abandoned = Arc::new(parking_lot::Mutex::new(false));
        let end = Arc::new(orphans::End::default());
        let (gone, count, orphan_end) = (abandoned.clone(), orphans.clone(), end.clone());
        // The message's trace goes with the handler to its thread.
        let trace = crate::trace::TraceContext::current();
        let spawned = std::thread::Builder::new()
            .name("acemq-handler-deadline".into())
            .spawn(move || {
                let _trace = trace.map(crate::trace::TraceContext::enter);
                let (ran, further) = orphans::watch(work);
                let gone = gone.lock();
                if *gone {
                    orphan_end.finish(accepted(&ran), further);
                    count.0.running.fetch_sub(1, Ordering::SeqCst);
                    log::info!(
                        "acemq: the orphaned handler of {what} finished; its result is discarded"
                    );
                } else {
                    let _ = tx.send((ran, further));
                }
            });
        if let Err(e) = spawned {
            return Waited::NotStarted(e);
        }
        let (ran, further) = match rx.recv_timeout(self.deadline.limit) {
            Ok(finished) => finished,
            Err(_) => {
                let mut gone = abandoned.lock();
                match rx.try_recv() {
                    Ok(finished) => finished,
                    Err(_) => {
                        // Counted in under the lock, so the thread cannot count itself out
                        // first.
                        *gone = true;
                        let now = orphans.0.running.fetch_add(1, Ordering::SeqCst) + 1;
                        let total = orphans.0.total.fetch_add(1, Ordering::SeqCst) + 1;
                        drop(gone);
                        orphans::overran(end);
                        return Waited::Overran(now, total);
                    }
                }
            }
        };
        // Orphans of deadlines further in are this thread's idempotency layer's to wait for.
        further.into_iter().for_each(orphans::overran);
        Waited::Done(ran)
    }

    /// The retry of an overrun message, reported to the observer.
    fn overrun(&self, m: &Message, now: usize, total: u64) -> Outcome {
        self.deadline.observer.overrun(&Overrun {
            message_id: m.id(),
            limit: self.deadline.limit,
            orphans: now,
            total,
        });
        Outcome::retry(format!(
            "acemq: handling message {} did not finish within {}",
            m.id(),
            go_duration(self.deadline.limit)
        ))
    }
}

fn accepted(ran: &Ran) -> bool {
    matches!(ran, Ok(Ok(Outcome::Accept)))
}

impl<H: Handler + Send + Sync + 'static> Handler for TimeLimited<H> {
    fn handle(&self, m: &Message) -> HandlerResult {
        if let Some(refused) = self.refused(&format!("message {}", m.id())) {
            return Ok(refused);
        }
        let (handler, message) = (self.handler.clone(), m.clone());
        let work = move || catch_unwind(AssertUnwindSafe(|| handler.handle(&message)));
        match self.run(format!("message {}", m.id()), work, |ran| {
            vec![accepted(ran)]
        }) {
            Waited::Done(Ok(result)) => result,
            Waited::Done(Err(panic)) => resume_unwind(panic as Box<dyn Any + Send>),
            Waited::Overran(now, total) => Ok(self.overrun(m, now, total)),
            Waited::NotStarted(e) => {
                Err(format!("acemq: could not start the handler's thread: {e}").into())
            }
        }
    }

    fn ordering(&self) -> Option<&OrderBy> {
        self.handler.ordering()
    }

    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }

    /// The deadline covers the batch as a whole (its messages' outcomes come together, so
    /// the batch is what overruns): one thread for the batch, and at the limit every message
    /// of it is a retry, reported to the observer each.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<Ran> {
        let first = messages.first().map(|m| m.id()).unwrap_or_default();
        let what = format!("a batch of {} messages from {first}", messages.len());
        if let Some(refused) = self.refused(&what) {
            return messages.iter().map(|_| Ok(Ok(refused.clone()))).collect();
        }
        let handler = self.handler.clone();
        let owned: Vec<Message> = messages.iter().map(|m| (*m).clone()).collect();
        let work = move || {
            let messages: Vec<&Message> = owned.iter().collect();
            catch_unwind(AssertUnwindSafe(|| handler.handle_batch(&messages)))
        };
        let accepted_each = |ran: &std::thread::Result<Vec<Ran>>| match ran {
            Ok(results) => results.iter().map(accepted).collect(),
            Err(_) => Vec::new(),
        };
        match self.run(what, work, accepted_each) {
            Waited::Done(Ok(results)) => results,
            Waited::Done(Err(panic)) => resume_unwind(panic as Box<dyn Any + Send>),
            Waited::Overran(now, total) => messages
                .iter()
                .map(|m| Ok(Ok(self.overrun(m, now, total))))
                .collect(),
            Waited::NotStarted(e) => messages
                .iter()
                .map(|_| {
                    Ok(Err(format!(
                        "acemq: could not start the handler's thread: {e}"
                    )
                    .into()))
                })
                .collect(),
        }
    }
}

/// A duration as Go prints one (`50ms`, `10s`, `1m30s`), as the family's error texts do.
fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        let micros = d.as_micros();
        if micros.is_multiple_of(1000) {
            format!("{}ms", micros / 1000)
        } else {
            format!("{}ms", d.as_secs_f64() * 1000.0)
        }
    } else {
        format_duration(d)
    }
}
