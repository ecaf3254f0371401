//! [`RunningConsumer`]: a consumer started on threads of its own ([`Consumer::start`]), closed
//! by [`RunningConsumer::close`] (or dropped).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::consumer::{check_inline, Consumer};
use super::flow::control::Control;
use super::flow::lifecycle;
use super::health::ConsumerHealth;
use super::options::ConsumerOptions;
use super::outcome::Handler;
use super::report::CloseReport;
use super::threads::context::Context;
use super::threads::Outer;
use crate::connection::Connection;
use crate::error::{panic_message, Error, Result};
use crate::health::Registered;
use crate::stop::StopHandle;

impl Connection {
    /// Starts consuming `queue` with default options on threads of its own.
    ///
    /// # Errors
    ///
    /// As [`consumer`](Self::consumer) and [`Consumer::start`].
    pub fn consume<H>(&self, queue: &str, handler: H) -> Result<RunningConsumer>
    where
        H: Handler + Send + Sync + 'static,
    {
        self.consumer(queue, ConsumerOptions::default())?
            .start(handler)
    }
}

impl Consumer {
    /// Starts the consumer on threads of its own (`acemq-consumer` and its workers) and returns
    /// once it is subscribed.
    ///
    /// # Errors
    ///
    /// Why the consumer's thread could not subscribe: [`Error::NotFound`] when the queue does
    /// not exist, [`Error::Amqp`] with the broker's text for another refusal of `basic.consume`
    /// (`RESOURCE_LOCKED`: an exclusive queue of another connection), [`Error::Io`] when a
    /// thread could not be spawned, [`Error::Handler`] when the thread panicked before it
    /// subscribed (a handler's [`ordering`](Handler::ordering), say); [`Error::Closed`] only
    /// when the consumer was stopped before it subscribed.
    pub fn start<H>(self, handler: H) -> Result<RunningConsumer>
    where
        H: Handler + Send + Sync + 'static,
    {
        check_inline(&self.ctx, &handler)?;
        let (started_tx, started_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let ctx = self.ctx.clone();
        let stop_rx = self.stop_rx.clone();
        let (control, control_rx) = crossbeam_channel::unbounded();
        let ended = Arc::new(AtomicBool::new(false));
        let ended_on_thread = EndedOnDrop(ended.clone());
        let thread = std::thread::Builder::new()
            .name(ctx.thread_name("acemq-consumer"))
            .spawn(move || {
                let _ended = ended_on_thread;
                // The report goes out on `done_tx` as soon as the owner is done; this returns
                // after every worker has ended. A failure that reached neither sender (a
                // thread that could not be spawned, a panic) goes out on `done_tx` too.
                let failed = done_tx.clone();
                let outer = Outer {
                    stop: &stop_rx,
                    control: &control_rx,
                };
                let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    lifecycle::run(&ctx, &handler, &outer, started_tx, &done_tx)
                }));
                drop(control_rx);
                let e = match ran {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) => e,
                    Err(panic) => Error::Handler {
                        source: format!(
                            "the consumer of {} panicked on its thread: {}",
                            ctx.who(),
                            panic_message(&*panic)
                        )
                        .into(),
                    },
                };
                if let Err(e) = failed.try_send(Err(e)) {
                    // The close report was sent already: it stands.
                    if let Err(e) = e.into_inner() {
                        log::error!("acemq: consumer of {} failed: {e}", ctx.who());
                    }
                }
            })
            .map_err(|e| Error::Io {
                context: "spawning the consumer thread".into(),
                source: e,
            })?;
        match started_rx.recv() {
            Ok(Ok(())) => {
                let health = self
                    .ctx
                    .connection
                    .register_health(Arc::new(ConsumerHealth {
                        ctx: self.ctx.clone(),
                        ended,
                    }));
                Ok(RunningConsumer {
                    consumer: self,
                    control,
                    thread: Some(thread),
                    done: done_rx,
                    _health: health,
                })
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                // The thread ended without subscribing: its failure, if it failed, is on
                // `done_rx`; otherwise it was stopped before it started.
                let _ = thread.join();
                match done_rx.try_recv() {
                    Ok(Err(e)) => Err(e),
                    _ => Err(Error::Closed { what: "consumer" }),
                }
            }
        }
    }
}

/// A consumer running on its own threads. Dropping it closes it (blocking up to the shutdown
/// timeout).
pub struct RunningConsumer {
    consumer: Consumer,
    /// To the consumer's thread: flow control (`flow.rs`).
    control: Sender<Control>,
    thread: Option<JoinHandle<()>>,
    done: Receiver<Result<CloseReport>>,
    /// Lists it in [`Connection::health`](crate::Connection::health) while it lives.
    _health: Registered,
}

/// Sets the consumer's health flag when its thread ends, however it ends.
struct EndedOnDrop(Arc<AtomicBool>);

impl Drop for EndedOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for RunningConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningConsumer")
            .field("consumer", &self.consumer)
            .finish()
    }
}

impl RunningConsumer {
    pub(super) fn context(&self) -> &Context {
        &self.consumer.ctx
    }

    /// Hands `control` to the consumer's thread.
    pub(super) fn control(&self, control: Control) -> Result<()> {
        self.control
            .send(control)
            .map_err(|_| Error::Closed { what: "consumer" })
    }

    /// A handle that stops this consumer from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.consumer.stop_handle()
    }

    /// Deliveries received and not yet settled (taken by a worker, held, or still in amiquip's
    /// buffer).
    pub fn in_flight(&self) -> usize {
        self.consumer.in_flight()
    }

    /// The most deliveries ever taken by this consumer and not yet settled at once (running,
    /// held for their ordering key, or waiting in the consumer for a retry; not those still in
    /// amiquip's buffer): never above the prefetch; with [`ConsumerOptions::at_most_once`]
    /// acknowledged deliveries whose handler still runs count too, so up to prefetch +
    /// concurrency.
    pub fn max_in_flight(&self) -> usize {
        self.consumer.max_in_flight()
    }

    /// With [`ConsumerOptions::at_most_once`], the messages lost: whose handler failed, or
    /// that were acknowledged after their worker had stopped waiting to hear so (not handled);
    /// 0 otherwise.
    pub fn lost(&self) -> u64 {
        self.consumer.lost()
    }

    /// True once the consumer has ended (stopped, or failed: see [`wait`](Self::wait)).
    pub fn is_finished(&self) -> bool {
        !self.done.is_empty() || self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Cancels the consumer, lets running handlers finish (up to the shutdown timeout) and
    /// settles them, requeues what was received but not started, closes the channel and joins
    /// the threads — except a handler still running at the deadline, which is left to finish on
    /// its own thread (its message goes back to the queue when the channel closes).
    ///
    /// # Errors
    ///
    /// The error that ended the consumer, if it ended on its own ([`Error::Cancelled`], …).
    pub fn close(mut self) -> Result<CloseReport> {
        self.consumer.stop.stop();
        self.finish()
    }

    /// Waits until the consumer ends on its own (stopped through a [`StopHandle`], or failed).
    ///
    /// # Errors
    ///
    /// The error that ended it.
    pub fn wait(mut self) -> Result<CloseReport> {
        self.finish()
    }

    fn finish(&mut self) -> Result<CloseReport> {
        let result = self
            .done
            .recv()
            .unwrap_or_else(|_| Err(Error::Closed { what: "consumer" }));
        if let Some(t) = self.thread.take() {
            if result.as_ref().map(|r| r.abandoned == 0).unwrap_or(true) {
                let _ = t.join();
            }
        }
        result
    }
}

impl Drop for RunningConsumer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.consumer.stop.stop();
            if let Err(e) = self.finish() {
                log::warn!(
                    "acemq: consumer of {} ended with: {e}",
                    self.consumer.ctx.who()
                );
            }
        }
    }
}
