//! [`Consumer`]: a consumer configured and validated (`Connection::consumer`), not yet running;
//! [`Consumer::run`] runs it on the caller's thread.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use super::flow::control::Ended;
use super::ladder::copy_failures::CopyFailures;
use super::ladder::policy::declare_failure_topology;
use super::options::ConsumerOptions;
use super::outcome::Handler;
use super::report::CloseReport;
use super::threads::context::{Context, InFlight};
use super::threads::{run_on, Outer};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::publish::PublisherOptions;
use crate::stop::StopHandle;

/// A consumer of one queue, not yet running: [`start`](Self::start) it on its own threads, or
/// [`run`](Self::run) it on the caller's thread.
///
/// The scoped form lets the handler borrow local state:
///
/// ```no_run
/// use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let consumer = connection.consumer("orders", ConsumerOptions::new().concurrency(4))?;
/// let stop = consumer.stop_handle();
/// let seen = AtomicUsize::new(0); // borrowed, not 'static
/// let handler = |_: &Message| {
///     seen.fetch_add(1, Ordering::SeqCst);
///     Ok(Outcome::Accept)
/// };
/// std::thread::scope(|s| {
///     let running = s.spawn(|| consumer.run(&handler));
///     // … publish, wait for what you expect …
///     stop.stop();
///     running.join().expect("consumer thread")
/// })?;
/// println!("handled {}", seen.load(Ordering::SeqCst));
/// # Ok(()) }
/// ```
pub struct Consumer {
    pub(super) ctx: Arc<Context>,
    pub(super) stop: StopHandle,
    pub(super) stop_rx: Receiver<()>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.ctx.queue)
            .field("prefetch", &self.ctx.prefetch())
            .field("concurrency", &self.ctx.concurrency())
            .finish()
    }
}

impl Connection {
    /// A consumer of `queue` with these options, not yet running.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] / [`Error::InvalidName`] for bad options; declaring the retry
    /// topology can fail with [`Error::TopologyConflict`].
    pub fn consumer(&self, queue: &str, options: ConsumerOptions) -> Result<Consumer> {
        options.validate(queue)?;
        if options.declare {
            declare_failure_topology(self, queue, &options.retry)?;
        }
        super::owner::limit_warning::warn_if_unguarded(self, queue);
        let publisher = self.publisher_with(
            PublisherOptions::new().window(usize::from(options.prefetch).max(16)),
        )?;
        let flag = Arc::new(AtomicBool::new(false));
        let (tx, stop_rx) = crossbeam_channel::bounded(1);
        let ctx = Arc::new(Context {
            queue: queue.to_string(),
            connection: self.clone(),
            publisher,
            policy: options.retry,
            codec: options.codec.unwrap_or_else(|| self.codec()),
            observer: self.observer().clone(),
            prefetch_now: AtomicU16::new(options.prefetch),
            concurrency_now: AtomicUsize::new(options.concurrency),
            exclusive: options.exclusive,
            arguments: options.arguments,
            shutdown_timeout_now: parking_lot::Mutex::new(options.shutdown_timeout),
            paused: AtomicBool::new(false),
            copy_failures: CopyFailures::default(),
            generation: AtomicU64::new(0),
            stopping: flag.clone(),
            in_flight: InFlight::default(),
            buffer: parking_lot::Mutex::new(None),
            max_in_flight: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            handled: Default::default(),
            running_deliveries: Default::default(),
            label: options.hook.as_ref().and_then(|h| h.label()),
            at_most_once: options.at_most_once,
            inline: options.inline,
            lost: AtomicU64::new(0),
            hook: options.hook,
            order: options.order,
            ack_first_wait: options
                .ack_first_wait
                .unwrap_or_else(|| options.shutdown_timeout.max(Duration::from_secs(30))),
            last_settled_ms: std::sync::atomic::AtomicI64::new(0),
        });
        Ok(Consumer {
            ctx,
            stop: StopHandle::with_waker(flag, tx),
            stop_rx,
        })
    }
}

impl Consumer {
    /// A handle that stops this consumer from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Deliveries received and not yet settled (taken by a worker, held, or still in amiquip's
    /// buffer).
    pub fn in_flight(&self) -> usize {
        // Taken first, then the buffer: a delivery taken in between is counted at most once.
        let taken = self.ctx.in_flight.count();
        taken
            + self
                .ctx
                .buffer
                .lock()
                .as_ref()
                .map_or(0, crate::transport::Deliveries::len)
    }

    /// The most deliveries ever taken by this consumer and not yet settled at once (running,
    /// held for their ordering key, or waiting in the consumer for a retry; not those still in
    /// amiquip's buffer): never above the prefetch; with [`ConsumerOptions::at_most_once`]
    /// acknowledged deliveries whose handler still runs count too, so up to prefetch +
    /// concurrency.
    pub fn max_in_flight(&self) -> usize {
        self.ctx.max_in_flight.load(Ordering::SeqCst)
    }

    /// With [`ConsumerOptions::at_most_once`], the messages lost: whose handler failed, or
    /// that were acknowledged after their worker had stopped waiting to hear so (not handled);
    /// 0 otherwise.
    pub fn lost(&self) -> u64 {
        self.ctx.lost.load(Ordering::SeqCst)
    }

    /// Consumes on the caller's thread (with `concurrency` scoped worker threads) until stopped
    /// through a [`StopHandle`], then closes as
    /// [`RunningConsumer::close`](crate::RunningConsumer::close) does. The handler needs `Sync`
    /// only, so it may borrow local state.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the queue does not exist; [`Error::Cancelled`] when the broker
    /// cancels the consumer (the queue was deleted); [`Error::Closed`] when the connection is
    /// closed.
    pub fn run<H: Handler + Sync + ?Sized>(&self, handler: &H) -> Result<CloseReport> {
        check_inline(&self.ctx, handler)?;
        let never = crossbeam_channel::never();
        let lines = Outer {
            stop: &self.stop_rx,
            control: &never,
        };
        match run_on(&self.ctx, handler, &lines, None, None)? {
            Ended::Closed(report) => Ok(report),
            // No control line: nothing can pause it.
            Ended::Control(report, _) => Ok(report),
        }
    }
}

/// Refuses [`ConsumerOptions::inline`] for a handler that needs the owner free while it runs
/// (ordered: the owner holds deliveries behind busy keys) or gathers batches (a worker waits for
/// a batch to fill).
pub(super) fn check_inline<H: Handler + Sync + ?Sized>(ctx: &Context, handler: &H) -> Result<()> {
    if !ctx.inline {
        return Ok(());
    }
    if ctx.ordering(handler).is_some() {
        return Err(Error::invalid(
            "an ordered handler cannot run inline: the consumer's thread decides which delivery \
             may run next while handlers run",
        ));
    }
    if handler.batch_limits().is_some() {
        return Err(Error::invalid(
            "a batching handler cannot run inline: it waits for its batch to fill",
        ));
    }
    Ok(())
}
