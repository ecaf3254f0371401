//! The handler chain: the concerns every handler needs — logging, a deadline, the idempotency
//! guard, ordering — put around one handler in an order you can read.
//!
//! ```no_run
//! use acemq_amqp::patterns::{
//!     by_header, chain, with_idempotency, with_logging, with_ordering, with_timeout,
//!     InMemoryIdempotencyStore,
//! };
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
//! works wherever it sits in the list.
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
use crate::patterns::{idempotent, ordered, IdempotencyStore};

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
        let took = started.elapsed();
        let kind = m.envelope.message_type.as_deref().unwrap_or("-");
        let attempt = m.envelope.attempt;
        match &result {
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
            Err(panic) => log::warn!(
                "acemq: message {} type={kind} attempt={attempt} took={took:?} outcome=panic: {}",
                m.id(),
                crate::error::panic_message(&**panic)
            ),
        }
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    fn ordering(&self) -> Option<&OrderBy> {
        self.handler.ordering()
    }
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

impl<H: Handler + Send + Sync + 'static> Handler for TimeLimited<H> {
    fn handle(&self, m: &Message) -> HandlerResult {
        let Deadline {
            limit,
            max_orphans,
            observer,
            orphans,
        } = &self.deadline;
        let running = orphans.running();
        if running >= *max_orphans {
            log::warn!(
                "acemq: message {} not started: {running} handlers are still running past \
                 their deadline of {limit:?} (at most {max_orphans})",
                m.id()
            );
            return Ok(Outcome::retry(format!(
                "acemq: not started: {running} handlers are still running past their deadline"
            )));
        }
        let (tx, rx) = crossbeam_channel::bounded::<Ran>(1);
        // Set under its lock by whichever side comes second: the waiter giving up, or the
        // handler's thread finishing after that (then it counts itself out).
        let abandoned = Arc::new(parking_lot::Mutex::new(false));
        let (handler, message) = (self.handler.clone(), m.clone());
        let (gone, count) = (abandoned.clone(), orphans.clone());
        // The message's trace goes with the handler to its thread.
        let trace = crate::trace::TraceContext::current();
        let spawned = std::thread::Builder::new()
            .name("acemq-handler-deadline".into())
            .spawn(move || {
                let _trace = trace.map(crate::trace::TraceContext::enter);
                let ran = catch_unwind(AssertUnwindSafe(|| handler.handle(&message)));
                let gone = gone.lock();
                if *gone {
                    count.0.running.fetch_sub(1, Ordering::SeqCst);
                    log::info!(
                        "acemq: the orphaned handler of message {} finished; its result is \
                         discarded",
                        message.id()
                    );
                } else {
                    let _ = tx.send(ran);
                }
            });
        if let Err(e) = spawned {
            return Err(format!("acemq: could not start the handler's thread: {e}").into());
        }
        let ran = match rx.recv_timeout(*limit) {
            Ok(ran) => Ok(ran),
            Err(_) => {
                let mut gone = abandoned.lock();
                match rx.try_recv() {
                    Ok(ran) => Ok(ran),
                    Err(_) => {
                        // Counted in under the lock, so the thread cannot count itself out
                        // first.
                        *gone = true;
                        let now = orphans.0.running.fetch_add(1, Ordering::SeqCst) + 1;
                        let total = orphans.0.total.fetch_add(1, Ordering::SeqCst) + 1;
                        Err((now, total))
                    }
                }
            }
        };
        match ran {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => resume_unwind(panic as Box<dyn Any + Send>),
            Err((now, total)) => {
                observer.overrun(&Overrun {
                    message_id: m.id(),
                    limit: *limit,
                    orphans: now,
                    total,
                });
                Ok(Outcome::retry(format!(
                    "acemq: handling message {} did not finish within {}",
                    m.id(),
                    go_duration(*limit)
                )))
            }
        }
    }

    fn ordering(&self) -> Option<&OrderBy> {
        self.handler.ordering()
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
