//! The owner thread: holds the amiquip channel and consumer (neither may leave this thread),
//! settles every delivery on that channel, and shuts the subscription down.
//!
//! **Who reads the deliveries.** With `ConsumerOptions::inline` the owner reads each one and runs
//! its handler on this thread ([`Lines::inline`]), then settles it before reading the next.
//! Otherwise, for a handler without ordering the workers read amiquip's
//! consumer buffer themselves (each holds a clone of its receiver, handed over per subscription
//! as a [`Feed`]): a delivery goes from amiquip's I/O thread straight to a worker, with no thread
//! in between, and the owner only hears of it when its settlement comes back. For an ordered
//! handler ([`Handler::ordering`]) the owner reads them, because it decides which may run (below),
//! and sends each on to the workers through a bounded channel. Either way the broker's prefetch
//! bounds how many are unsettled at once, so nothing here grows with the backlog.
//!
//! **Acknowledgements.** Delivery tags on a channel are consecutive from 1, so the owner knows
//! which deliveries are settled without seeing them arrive: the completed run at the front (from
//! the lowest tag not yet settled) is acknowledged with one `multiple` ack; a completed delivery
//! behind one still unsettled (running, held, or not yet read) is acknowledged on its own, so a
//! slow handler never holds the prefetch window hostage, and a `multiple` ack never covers a
//! delivery that is not done ([`Acks`]).
//!
//! **Ordered dispatch.** When the handler asks for it ([`Handler::ordering`]), each delivery's
//! key is computed here; a delivery whose key is busy (an earlier delivery with the key not yet
//! done) is **held here**, unsettled, in a first-in first-out queue per key instead of going to
//! the workers, and is sent on when the earlier one's settlement (or key release) comes back.
//! No worker ever waits for a key. What is held is bounded by the prefetch like everything in
//! flight, and a held delivery is an ordinary unsettled slot: a `multiple` ack never covers it.
//! A new subscription (reconnect) starts with no keys.
//!
//! [`Handler::ordering`]: super::Handler::ordering
//! [`Feed`]: super::worker::source::Feed

pub(in crate::consume) mod acks;
pub(in crate::consume) mod limit_warning;
pub(in crate::consume) mod ordered;
pub(in crate::consume) mod put_back;
pub(in crate::consume) mod settle;
pub(in crate::consume) mod subscribe;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::transport::{Channel, ConsumerMessage, Deliveries, Delivery};
use crossbeam_channel::{Receiver, Select, Sender};

use super::flow::control::{Control, Ended, Started};
use super::ladder::timer::STOP_TIMEOUT;
use super::outcome::OrderBy;
use super::report::CloseReport;
use super::threads::context::Context;
use super::threads::protocol::{Job, Settle, TimerMsg};
use super::worker::source::Feed;
use crate::error::{Error, Result};
use acks::Acks;
use ordered::Ordered;
use put_back::put_back;
use settle::{finished_in, gone, settle, settled_some, with_waiting, State};
use subscribe::cancel_and_drain;
use subscribe::{
    begin_generation, consume_error, consume_on, count_returned, fail, reply_returned,
    subscribe_channel, wait_for_link,
};

/// Why the inner loop ended.
enum End {
    /// Stop requested: shut down and return the report.
    Stop(CloseReport),
    /// The application's flow control ended the subscription (shut down as for a stop).
    Control(CloseReport, Control),
    /// The channel or connection went away: subscribe again.
    Lost(String),
}

/// Runs until stopped (or a [`Control`] ends the subscription), recovering with the
/// connection. `started` hears about the first subscription (or its failure).
pub(crate) fn run(
    ctx: &Context,
    order: Option<&OrderBy>,
    lines: &Lines<'_>,
    started: Option<Started>,
) -> Result<Ended> {
    // Generations go on from the consumer's last subscription (flow control subscribes again).
    let mut generation = ctx.generation.load(Ordering::SeqCst);
    let retry_first = started.as_ref().is_some_and(|s| s.retry);
    let mut started = started.map(|s| s.tx);
    loop {
        // Before the first subscription any error is the caller's (unless it asked for the
        // first to be retried, as a resume does); after it, only a closed connection or a
        // refusal that retrying cannot fix ends the consumer.
        let first = started.is_some() && !retry_first;
        let link = match wait_for_link(ctx, first) {
            Ok(Some(link)) => link,
            Ok(None) => return Ok(Ended::Closed(CloseReport::default())),
            Err(e) => return fail(&mut started, e).map(Ended::Closed),
        };
        generation += 1;
        begin_generation(ctx, generation, lines.queued);
        let channel = match subscribe_channel(ctx, &link) {
            Ok(c) => c,
            Err(e) if first || !e.is_retriable() => {
                return fail(&mut started, e).map(Ended::Closed)
            }
            Err(e) => {
                log::warn!("acemq: resubscribing to {} failed: {e}", ctx.who());
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        // What a hook published on this channel and the broker could not route (a responder's
        // replies).
        let returns = match ctx.hook.as_ref().filter(|h| h.listens_for_returns()) {
            Some(_) => match channel.listen_for_returns() {
                Ok(returns) => returns,
                Err(e) if first => {
                    return fail(&mut started, consume_error(&ctx.queue, e)).map(Ended::Closed)
                }
                Err(e) => {
                    log::warn!("acemq: resubscribing to {} failed: {e}", ctx.who());
                    continue;
                }
            },
            None => crate::transport::Feed::never(),
        };
        let consumer = match consume_on(ctx, &channel) {
            Ok(c) => c,
            Err(e) if first || !e.is_retriable() => {
                return fail(&mut started, e).map(Ended::Closed)
            }
            Err(e) => {
                log::warn!("acemq: resubscribing to {} failed: {e}", ctx.who());
                continue;
            }
        };
        *ctx.buffer.lock() = Some(consumer.receiver().clone());
        // Workers reading the subscription themselves get its buffer now.
        for feed in lines.feeds {
            let _ = feed.send(Feed {
                generation,
                deliveries: consumer.receiver().clone(),
            });
        }
        if let Some(tx) = started.take() {
            let _ = tx.send(Ok(()));
        }
        let mut state = State {
            generation,
            acks: Acks::new(),
            ordered: Ordered::new(order),
            ended: 0,
            reason: None,
        };
        let end = serve(ctx, &channel, &consumer, &returns, &mut state, lines);
        end_subscription(ctx, &end, consumer);
        if !matches!(end, Ok(End::Lost(_))) {
            // The close waits for the broker's close-ok: every reply it returned is in.
            let _ = channel.close();
        }
        count_returned(ctx, &returns);
        match end {
            Ok(End::Stop(report)) => return Ok(Ended::Closed(report)),
            Ok(End::Control(report, control)) => return Ok(Ended::Control(report, control)),
            Ok(End::Lost(_)) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Ends one subscription: cancels the amiquip consumer (unless stop already did) and says why.
fn end_subscription(ctx: &Context, end: &Result<End>, consumer: crate::transport::Consumer<'_>) {
    if !matches!(end, Ok(End::Stop(_) | End::Control(..))) {
        // Stop already cancelled it; see `cancel_and_drain` for why this must run.
        cancel_and_drain(&ctx.queue, &consumer, drop);
    }
    drop(consumer);
    let buffered = ctx.buffer.lock().take().map_or(0, |b| b.len());
    let unsettled = ctx.in_flight.clear() + buffered;
    ctx.observer.in_flight(&crate::observe::InFlight {
        queue: &ctx.queue,
        in_flight: 0,
    });
    if let Ok(End::Lost(why)) = end {
        log::warn!(
            "acemq: consumer of {} lost its channel ({why}); {unsettled} unsettled deliveries \
             will be redelivered; resubscribing",
            ctx.who(),
        );
    }
}

/// The channels the owner thread talks through.
pub(crate) struct Lines<'a> {
    /// Runs one delivery's handler on this thread, for a consumer without worker threads.
    pub(crate) inline: Option<&'a dyn Fn(Job)>,
    /// To the workers (an ordered handler's deliveries, and its held retries run again).
    pub(crate) jobs: &'a Sender<Job>,
    /// The same hand-off, read by the owner only to take back jobs no worker has started.
    pub(crate) queued: &'a Receiver<Job>,
    /// To each worker that reads the subscription itself, one per worker: each subscription's
    /// buffer. Empty for an ordered handler.
    pub(crate) feeds: &'a [Sender<Feed>],
    /// From the workers and the timer.
    pub(crate) settles: &'a Receiver<Settle>,
    /// From a [`StopHandle`](super::StopHandle).
    pub(crate) stop: &'a Receiver<()>,
    /// From the application's flow control (`flow.rs`).
    pub(crate) control: &'a Receiver<Control>,
    /// To the timer thread.
    pub(crate) timer: &'a Sender<TimerMsg>,
}

fn serve(
    ctx: &Context,
    channel: &Channel,
    consumer: &crate::transport::Consumer<'_>,
    returns: &crate::transport::Feed<crate::transport::Return>,
    state: &mut State<'_>,
    lines: &Lines<'_>,
) -> Result<End> {
    let mut report = CloseReport::default();
    // The owner reads the deliveries only for an ordered handler (no worker has a feed).
    let deliveries = if lines.feeds.is_empty() {
        consumer.receiver().clone()
    } else {
        Deliveries::never()
    };
    let mut returned = returns.clone();
    loop {
        let mut select = Select::new();
        let on_returned = returned.register(&mut select);
        let on_delivery = deliveries.register(&mut select);
        let on_settle = select.recv(lines.settles);
        let on_control = select.recv(lines.control);
        select.recv(lines.stop);
        let op = select.select();
        match op.index() {
            i if i == on_returned => match returned.read(op) {
                Ok(r) => reply_returned(ctx, r),
                // The channel is gone: the deliveries say so next.
                Err(_) => returned = crate::transport::Feed::never(),
            },
            i if i == on_delivery => match deliveries.read(op) {
                Ok(ConsumerMessage::Delivery(d)) => match lines.inline {
                    Some(run) => {
                        if let Err(e) = run_inline(ctx, channel, d, state, lines, run, &mut report)
                        {
                            return Ok(End::Lost(e.to_string()));
                        }
                    }
                    None => dispatch(ctx, d, state, lines.jobs),
                },
                Ok(other) => state.reason = Some(other),
                Err(_) => state.ended += 1,
            },
            i if i == on_settle => {
                let Ok(s) = op.recv(lines.settles) else {
                    return Ok(End::Lost("workers ended".into()));
                };
                let batch = with_waiting(s, lines.settles);
                if let Err(e) = settle(ctx, channel, state, lines.jobs, batch, &mut report) {
                    return Ok(End::Lost(e.to_string()));
                }
            }
            i if i == on_control => match op.recv(lines.control) {
                Ok(Control::Resume(reply)) => {
                    // Not paused: nothing to do.
                    let _ = reply.send(Ok(()));
                }
                Ok(control) => {
                    shutdown(ctx, channel, consumer, state, lines, &mut report);
                    return Ok(End::Control(report, control));
                }
                // The running consumer's handle is gone: it is being dropped, which stops it.
                Err(_) => {}
            },
            _ => {
                let _ = op.recv(lines.stop);
                shutdown(ctx, channel, consumer, state, lines, &mut report);
                return Ok(End::Stop(report));
            }
        }
        if state.reason.is_none() && state.ended == 0 {
            continue;
        }
        if state.reason.is_none() && state.ended < lines.feeds.len() {
            if let Err(e) = wait_for_reason(ctx, channel, state, lines, &mut report) {
                return Ok(End::Lost(e.to_string()));
            }
        }
        // The subscription ended: read by the owner or reported by a worker.
        return match state.reason.take() {
            Some(ConsumerMessage::ServerCancelled) => {
                // The queue was deleted (or the broker cancelled us): finish what is running
                // and end with a clear error.
                shutdown(ctx, channel, consumer, state, lines, &mut report);
                Err(Error::Cancelled {
                    queue: ctx.queue.clone(),
                })
            }
            Some(ConsumerMessage::ServerClosedChannel(e)) => Ok(End::Lost(e.to_string())),
            Some(ConsumerMessage::ServerClosedConnection(e)) => Ok(End::Lost(e.to_string())),
            Some(other) => Ok(End::Lost(format!("{other:?}"))),
            None => Ok(End::Lost("the connection dropped".into())),
        };
    }
}

/// Runs a delivery's handler on this thread ([`ConsumerOptions::inline`]) and settles it at
/// once. A handler that was running when a stop came counts as finished, as one on a worker
/// that ends within the shutdown timeout does (inline, closing waits for it).
///
/// [`ConsumerOptions::inline`]: super::ConsumerOptions::inline
fn run_inline(
    ctx: &Context,
    channel: &Channel,
    d: Delivery,
    state: &mut State<'_>,
    lines: &Lines<'_>,
    run: &dyn Fn(Job),
    report: &mut CloseReport,
) -> std::result::Result<(), crate::transport::AmqpError> {
    let stopping = ctx.stop_requested();
    run(Job::taken(ctx, state.generation, d));
    let batch: Vec<Settle> = lines.settles.try_iter().collect();
    if !stopping && ctx.stop_requested() {
        report.finished_in_time += finished_in(&batch, state.generation);
    }
    if batch.is_empty() {
        return Ok(());
    }
    settle(ctx, channel, state, lines.jobs, batch, report)
}

/// A worker found the subscription's buffer ended before any worker reported why. The worker
/// that read the reason (amiquip sends one before ending the buffer, unless the connection
/// dropped) may still be on its way to say so: wait for it, for every reader to report the end
/// (each sends what it read before it can see the end), or for a bounded time.
fn wait_for_reason(
    ctx: &Context,
    channel: &Channel,
    state: &mut State<'_>,
    lines: &Lines<'_>,
    report: &mut CloseReport,
) -> std::result::Result<(), crate::transport::AmqpError> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while state.reason.is_none() && state.ended < lines.feeds.len() {
        let Ok(s) = lines.settles.recv_deadline(deadline) else {
            break;
        };
        settle(
            ctx,
            channel,
            state,
            lines.jobs,
            with_waiting(s, lines.settles),
            report,
        )?;
    }
    Ok(())
}

/// A delivery the owner read (an ordered handler): to the workers, or held behind its key.
fn dispatch(ctx: &Context, d: Delivery, state: &mut State<'_>, jobs: &Sender<Job>) {
    let job = Job::taken(ctx, state.generation, d);
    if let Some(job) = state.ordered.admit(job) {
        // Never blocks: the channel holds `prefetch` jobs, each an unsettled delivery, and the
        // broker sends no more than that unsettled.
        let _ = jobs.send(job);
    }
}

/// Stop: cancel, requeue what was delivered but not started (on its way, waiting in the
/// hand-off, or held by the timer), let running handlers finish up to the deadline and settle
/// them. What is still running then is `abandoned`; what never started is `requeued`.
///
/// When the workers read the subscription themselves, a delivery one of them took is counted in
/// flight before that worker can report the subscription ended (its receiver disconnected after
/// the cancel): so once every worker has reported it and nothing is in flight, every delivery
/// taken is settled.
fn shutdown(
    ctx: &Context,
    channel: &Channel,
    consumer: &crate::transport::Consumer<'_>,
    state: &mut State<'_>,
    lines: &Lines<'_>,
    report: &mut CloseReport,
) {
    let generation = state.generation;
    ctx.stopping.store(true, Ordering::SeqCst);
    // Held retries go back to the queue unchanged; the timer answers on `settles`.
    let _ = lines.timer.send_timeout(TimerMsg::Stop, STOP_TIMEOUT);
    // Deliveries that were on their way before the cancel: back to the queue (workers reading
    // the subscription put back those they read; they see `stopping`).
    // (Put back without spending the broker's delivery limit: `put_back.rs`.)
    let acks = &mut state.acks;
    cancel_and_drain(&ctx.queue, consumer, |mut d| {
        let message = d.take_message();
        if put_back(ctx, channel, acks, d, &message).is_ok() {
            report.requeued += 1;
        }
    });
    // Jobs no worker has taken yet, and those waiting for their ordering key: back to the queue
    // now, not counted as running.
    let waiting = state.ordered.drain();
    for job in lines.queued.try_iter().chain(waiting) {
        if job.generation != generation {
            continue;
        }
        state.ordered.forget(job.tag);
        if put_back(ctx, channel, &mut state.acks, job.delivery, &job.message).is_ok() {
            report.requeued += 1;
        }
        gone(ctx, generation);
    }
    settled_some(ctx);
    // Each worker with a feed reports the end of the subscription once (none for an ordered
    // handler: the owner reads it).
    let deadline = Instant::now() + ctx.shutdown_timeout();
    while ctx.in_flight.count() > 0 || state.ended < lines.feeds.len() {
        match lines.settles.recv_deadline(deadline) {
            Ok(s) => {
                let batch = with_waiting(s, lines.settles);
                report.finished_in_time += finished_in(&batch, generation);
                if let Err(e) = settle(ctx, channel, state, lines.jobs, batch, report) {
                    log::warn!("acemq: settling while closing {}: {e}", ctx.who());
                    break;
                }
            }
            Err(_) => break,
        }
    }
    // Every handler still running (also one on a delivery from before a reconnect, which is
    // not among this subscription's deliveries): closing does not wait for it. Its delivery is
    // given back here, by the rule of `put_back.rs`, rather than by the channel's close, which
    // RabbitMQ 4.x counts against a quorum queue's delivery limit (`abandon.rs`).
    report.abandoned = ctx.running.load(Ordering::SeqCst);
    report.handled = ctx.handled.load(Ordering::Relaxed);
    let abandoned = ctx.running_deliveries.abandon(generation);
    for (delivery, copy) in abandoned {
        let tag = delivery.delivery_tag();
        let given = match &copy {
            Some(message) => put_back(ctx, channel, &mut state.acks, delivery, message).map(|_| ()),
            None => delivery
                .nack(channel, true)
                .map(|()| state.acks.settled(tag)),
        };
        if let Err(e) = given {
            log::warn!(
                "acemq: giving back an abandoned delivery of {}: {e}",
                ctx.who()
            );
        }
    }
    if report.abandoned > 0 {
        log::warn!(
            "acemq: {} deliveries on {} were still being handled after {:?}; they were given \
             back to the queue, and their handlers' results will be dropped",
            report.abandoned,
            ctx.who(),
            ctx.shutdown_timeout()
        );
    }
}
