//! The handler chain: the concerns every handler needs — logging, a deadline, the idempotency
//! guard, ordering — put around one handler in an order you can read.
//!
//! ```no_run
//! use acemq_amqp::patterns::ordering::by_header;
//! use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
//! use acemq_amqp::patterns::chain::{chain, with_idempotency, with_logging, with_ordering, with_timeout};
//! use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
//! use std::time::Duration;
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let handler = chain(
//!     |m: &Message| {
//!         println!("shipping {}", m.id());
//!         Ok(Outcome::Accept)
//!     },
//!     [
//!         with_logging(),
//!         with_timeout(Duration::from_secs(10)),
//!         with_idempotency(InMemoryIdempotencyStore::default()),
//!         with_ordering(by_header("order-id")),
//!     ],
//! );
//! let options = ConsumerOptions::new().concurrency(8).prefetch(128);
//! let running = connection.consumer("shipments", options)?.start(handler)?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! The list reads **outermost first**: the first layer sees the message first and the outcome
//! last, so logging (outermost) records what the deadline and the idempotency guard decided.
//! Each layer is also a plain [`Handler`] wrapper that works alone: [`Logged`],
//! [`TimeLimited`] (made by a [`Deadline`]), [`idempotent`](fn@idempotent) and [`ordered`]. Every one of them
//! passes on the ordering of the handler it wraps ([`Handler::ordering`]), so `with_ordering`
//! works wherever it sits in the list, and its batching ([`Handler::batch_limits`],
//! [`Handler::handle_batch`]), so a batched [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)
//! inside a chain still gets its batches from the consumer's worker: the logging layer writes a
//! line per message of a batch (with the batch's duration), the deadline covers the batch as a
//! whole (below), the idempotency layer claims each message of a batch on its own and hands
//! the claimed ones on in one batch.
//!
//! There is no layer that turns an error into a decision: an `Err` or a panic escaping a handler
//! is already a retry, which is what most failures want.
//!
//! # `with_timeout`: what a deadline can and cannot do
//!
//! Each message's handler runs on a thread of its own (`acemq-handler-deadline`, one per
//! message) while the worker waits up to the limit. A handler that finishes in time settles as
//! it decided (a panic in it is passed on to the consumer, which retries it). One that overruns
//! is settled **as a retry, on time** — retrying work that may have succeeded risks doing it
//! twice, accepting work that may have failed loses it, and duplicates can be made harmless
//! ([`idempotent`](fn@idempotent)) while a loss cannot — with the error
//! `acemq: handling message {id} did not finish within {limit}`.
//!
//! **The overrunning thread cannot be interrupted** (Rust has no way to stop a thread): it runs
//! on to the end of what it was doing, as an *orphan*, and its result is thrown away. Orphans
//! are counted ([`Deadline::orphans`]) and each overrun is reported to the observer
//! ([`Observer::overrun`], set with [`Deadline::observer`]). While [`Deadline::max_orphans`]
//! (default 16) orphans of a wrapper are still running, a new message is **not started** and is
//! settled as a retry at once (`acemq: not started: {n} handlers are still running past their
//! deadline`), so a handler stuck for good cannot pile up threads without bound. The limit is
//! checked when a message starts, and a handler already running when it is reached may still
//! overrun: with a consumer of concurrency `c` at most `max_orphans + c − 1` orphans exist at once
//! (a strict `max_orphans` would have to refuse to start handlers that may well finish in time).
//! Its message still retries: the key of an ordered message is freed when the overrun is settled,
//! so the next message with the key may run beside the orphan.
//!
//! **A batch** (a batched handler inside the deadline) runs on one thread as a whole, and the
//! limit is the batch's: its messages' outcomes come together, so the batch is what overruns,
//! and then every message of it is a retry (each reported to the observer; one orphan). Give a
//! batched handler a limit for a whole batch.
//!
//! **With the idempotency layer, in either order.** Inside [`idempotent`](fn@idempotent)
//! (`with_idempotency` after `with_timeout` in the list) the orphan runs the whole idempotent
//! step and confirms its own claim if it finishes. Outside it (`with_idempotency` before
//! `with_timeout`) the idempotency layer learns of the overrun and **holds the message's
//! claim until the orphan has ended** — confirming it if the orphan accepted, giving it back
//! if not — instead of giving it back at once: meanwhile the retry finds the key in progress
//! and comes back later, so it never runs beside the orphan and the effect is not applied
//! twice. (An orphan that outlives the claim's lease can still be taken over, as any handler
//! that slow can.)
//!
//! # `with_logging`
//!
//! One line per message through the `log` crate (target `acemq_amqp::patterns::chain`): id,
//! type, attempt, outcome (with the reason the handler gave, or its error) and duration — at
//! info for an outcome, warn for an error or a panic. **Never the payload**: it is the one part
//! of a message that may not be safe to write down.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::consume::{format_duration, Handler, HandlerResult, OrderBy, Outcome};
use crate::envelope::Message;
use crate::observe::{LogObserver, Observer, Overrun};
use crate::patterns::idempotency::IdempotencyStore;
use crate::patterns::idempotent::idempotent;
use crate::patterns::ordering::ordered;

/// A handler behind a box, as the chain's layers take and return it.
pub type BoxHandler = Box<dyn Handler + Send + Sync>;

/// One layer of a [`chain`]: wraps the handler inside it.
pub struct Layer {
    wrap: Box<dyn FnOnce(BoxHandler) -> BoxHandler + Send>,
}

impl Layer {
    /// A layer from any wrapping function.
    pub fn new<F>(wrap: F) -> Layer
    where
        F: FnOnce(BoxHandler) -> BoxHandler + Send + 'static,
    {
        Layer {
            wrap: Box::new(wrap),
        }
    }

    /// This layer alone around `handler`.
    pub fn around<H: Handler + Send + Sync + 'static>(self, handler: H) -> BoxHandler {
        (self.wrap)(Box::new(handler))
    }
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Layer")
    }
}

/// `handler` wrapped in `layers`, **outermost first** (see the [module docs](self)).
pub fn chain<H, L>(handler: H, layers: L) -> Chain
where
    H: Handler + Send + Sync + 'static,
    L: IntoIterator<Item = Layer>,
{
    let layers: Vec<Layer> = layers.into_iter().collect();
    let mut composed: BoxHandler = Box::new(handler);
    // Applied innermost first, so that the first one named ends up outermost.
    for layer in layers.into_iter().rev() {
        composed = (layer.wrap)(composed);
    }
    Chain(composed)
}

/// A handler wrapped by [`chain`].
pub struct Chain(BoxHandler);

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("ordering", &self.0.ordering())
            .finish()
    }
}

impl Handler for Chain {
    fn handle(&self, message: &Message) -> HandlerResult {
        self.0.handle(message)
    }
    fn ordering(&self) -> Option<&OrderBy> {
        self.0.ordering()
    }
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.0.batch_limits()
    }
    fn handle_batch(&self, messages: &[&Message]) -> Vec<Ran> {
        self.0.handle_batch(messages)
    }
}

/// The logging layer: [`Logged`] around the rest of the chain.
pub fn with_logging() -> Layer {
    Layer::new(|inner| Box::new(Logged::new(inner)))
}

/// The deadline layer: [`Deadline::new(limit)`](Deadline::new) with its defaults. Build a
/// [`Deadline`] to count its orphans or give it an observer, and turn it into a layer with
/// [`Deadline::layer`].
pub fn with_timeout(limit: Duration) -> Layer {
    Deadline::new(limit).layer()
}

/// The idempotency layer: [`idempotent`](fn@idempotent) with `store`, keyed by message id.
pub fn with_idempotency<S>(store: S) -> Layer
where
    S: IdempotencyStore + 'static,
{
    Layer::new(move |inner| Box::new(idempotent(store, inner)))
}

/// The ordering layer: [`ordered`] by `key`.
pub fn with_ordering<K>(key: K) -> Layer
where
    K: Fn(&Message) -> Option<String> + Send + Sync + 'static,
{
    Layer::new(move |inner| Box::new(ordered(key, inner)))
}

/// Logs id, type, attempt, outcome and duration of each message its handler handles, never the
/// payload (see the [module docs](self#with_logging)).
pub struct Logged<H> {
    handler: H,
}

impl<H> Logged<H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> Self {
        Logged { handler }
    }
}

impl<H: Handler> Handler for Logged<H> {
    fn handle(&self, m: &Message) -> HandlerResult {
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| self.handler.handle(m)));
        log_line(m, started.elapsed(), &result);
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    fn ordering(&self) -> Option<&OrderBy> {
        self.handler.ordering()
    }

    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }

    /// One line per message of the batch, each with the batch's duration.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<Ran> {
        let started = Instant::now();
        let results = catch_unwind(AssertUnwindSafe(|| self.handler.handle_batch(messages)));
        let took = started.elapsed();
        match &results {
            Ok(results) => {
                for (m, result) in messages.iter().zip(results) {
                    log_line(m, took, result);
                }
            }
            Err(panic) => {
                for m in messages {
                    log_panic(m, took, &**panic);
                }
            }
        }
        match results {
            Ok(results) => results,
            Err(panic) => resume_unwind(panic),
        }
    }
}

/// The logging layer's line for one message.
fn log_line(m: &Message, took: Duration, result: &Ran) {
    let kind = m.envelope.message_type.as_deref().unwrap_or("-");
    let attempt = m.envelope.attempt;
    match result {
        Ok(Ok(outcome)) => {
            let (label, reason) = describe(outcome);
            log::info!(
                "acemq: message {} type={kind} attempt={attempt} took={took:?} outcome={label}{}",
                m.id(),
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            );
        }
        Ok(Err(e)) => log::warn!(
            "acemq: message {} type={kind} attempt={attempt} took={took:?} outcome=error: {e}",
            m.id()
        ),
        Err(panic) => log_panic(m, took, &**panic),
    }
}

fn log_panic(m: &Message, took: Duration, panic: &(dyn Any + Send)) {
    let kind = m.envelope.message_type.as_deref().unwrap_or("-");
    log::warn!(
        "acemq: message {} type={kind} attempt={} took={took:?} outcome=panic: {}",
        m.id(),
        m.envelope.attempt,
        crate::error::panic_message(panic)
    );
}

/// An outcome's label and the reason it carries.
fn describe(outcome: &Outcome) -> (&'static str, Option<String>) {
    let reason = match outcome {
        Outcome::Accept => None,
        Outcome::Retry { reason, .. } | Outcome::Reject { reason } | Outcome::Park { reason } => {
            Some(reason.clone())
        }
        Outcome::InProgress { delay } => Some(format!("back in {delay:?}")),
    };
    (outcome.label(), reason)
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
    /// A deadline of `limit` (at least 1 ms: a zero limit is taken as 1 ms).
    pub fn new(limit: Duration) -> Deadline {
        Deadline {
            limit: limit.max(Duration::from_millis(1)),
            max_orphans: 16,
            observer: Arc::new(LogObserver),
            orphans: OrphanCount::default(),
        }
    }

    /// While this many orphaned handler threads (still running past their deadline) run, a new
    /// message is settled as a retry without starting. Handlers already running may still
    /// overrun, so with `c` running at once up to `max_orphans + c − 1` orphans can exist (see
    /// the [module docs](self#with_timeout-what-a-deadline-can-and-cannot-do)). At least 1.
    /// Defaults to 16.
    pub fn max_orphans(mut self, max: usize) -> Self {
        self.max_orphans = max.max(1);
        self
    }

    /// Where overruns are reported ([`Observer::overrun`]); give it the connection's observer.
    /// Defaults to [`LogObserver`] (a warning).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = crate::observe::Guarded::wrap(observer);
        self
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

    /// This deadline as a [`chain`] layer.
    pub fn layer(self) -> Layer {
        Layer::new(move |inner| Box::new(self.around(inner)))
    }
}

/// A handler with a deadline, made by [`Deadline::around`] (see the
/// [module docs](self#with_timeout-what-a-deadline-can-and-cannot-do)).
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

type Ran = std::thread::Result<HandlerResult>;

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

/// How the deadline tells the idempotency layer around it that a handler it gave up on still
/// runs: the idempotency layer [`watch`]es the call to the handler inside it; a deadline that
/// overruns on that thread reports its orphan's [`End`] ([`overran`]), and the idempotency
/// layer holds the message's claim until the orphan has ended (then confirms it if the orphan
/// accepted, else gives it back) instead of giving it back while the orphan still works, which
/// would let the retry run beside it. Whatever order the chain's layers are in.
pub(crate) mod orphans {
    use std::cell::RefCell;
    use std::sync::Arc;

    use parking_lot::Mutex;

    thread_local! {
        /// The watches open on this thread, innermost last.
        static WATCHES: RefCell<Vec<Vec<Arc<End>>>> = const { RefCell::new(Vec::new()) };
    }

    /// The end of an orphaned handler: each message's accept or not, once it has ended (and the
    /// orphans it saw further in have ended too).
    #[derive(Default)]
    pub(crate) struct End {
        state: Mutex<EndState>,
    }

    #[derive(Default)]
    struct EndState {
        accepted: Option<Vec<bool>>,
        further: Vec<Arc<End>>,
    }

    impl End {
        pub(super) fn finish(&self, accepted: Vec<bool>, further: Vec<Arc<End>>) {
            let mut state = self.state.lock();
            state.accepted = Some(accepted);
            state.further = further;
        }

        /// Each message's accept or not (in the order the orphan was given them), once it and
        /// every orphan it saw have ended; `None` while one still runs.
        pub(crate) fn ended(&self) -> Option<Vec<bool>> {
            let state = self.state.lock();
            let accepted = state.accepted.clone()?;
            state
                .further
                .iter()
                .all(|end| end.ended().is_some())
                .then_some(accepted)
        }
    }

    /// Runs `f` with a watch open on this thread: its result and the orphans reported meanwhile
    /// (also passed on to a watch around this one).
    pub(crate) fn watch<T>(f: impl FnOnce() -> T) -> (T, Vec<Arc<End>>) {
        /// Closes the watch also when `f` panics.
        struct Open;
        impl Drop for Open {
            fn drop(&mut self) {
                WATCHES.with(|w| {
                    let mut w = w.borrow_mut();
                    if let Some(seen) = w.pop() {
                        if let Some(around) = w.last_mut() {
                            around.extend(seen);
                        }
                    }
                });
            }
        }
        WATCHES.with(|w| w.borrow_mut().push(Vec::new()));
        let open = Open;
        let result = f();
        let seen = WATCHES.with(|w| w.borrow().last().cloned().unwrap_or_default());
        drop(open);
        (result, seen)
    }

    /// Reports an orphan to the innermost watch on this thread (none: nobody waits for it).
    pub(crate) fn overran(end: Arc<End>) {
        WATCHES.with(|w| {
            if let Some(watch) = w.borrow_mut().last_mut() {
                watch.push(end);
            }
        });
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
