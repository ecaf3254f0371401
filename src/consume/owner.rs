//! The owner thread: holds the amiquip channel and consumer (neither may leave this thread),
//! and `select!`s over deliveries, settlements from the workers, and stop.
//!
//! Deliveries go to the workers through a bounded channel; the broker's prefetch bounds how many
//! are unsettled at once, so nothing here grows with the backlog. Acknowledgements of a
//! contiguous run of completed deliveries at the front are coalesced into one `multiple` ack;
//! a completed delivery behind a still-running one is acknowledged on its own, so a slow
//! handler never holds the prefetch window hostage.
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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use amiquip::{Channel, ConsumerMessage, ConsumerOptions as AmqpConsumerOptions, Delivery};
use crossbeam_channel::{select, Receiver, Sender};

use super::timer::TimerMsg;
use super::{CloseReport, Context, Job, OrderBy, Settle, SettleAction};
use std::sync::Arc;

use crate::connection::Link;
use crate::envelope::Message;
use crate::error::{Error, Result};
use crate::observe::Settlement;

/// Why the inner loop ended.
enum End {
    /// Stop requested: shut down and return the report.
    Stop(CloseReport),
    /// The channel or connection went away: subscribe again.
    Lost(String),
}

struct Slot {
    /// `None` once acknowledged ahead of its handler (at most once).
    delivery: Option<Delivery>,
    done: bool,
    /// Its ordering key while it holds the key.
    key: Option<String>,
}

/// Ordering keys busy in this subscription, each with the deliveries waiting for it, in
/// delivery order.
#[derive(Default)]
struct Keys {
    waiting: HashMap<String, VecDeque<Job>>,
}

impl Keys {
    /// Takes `key` for a delivery: true when it was free (send the job now), false when the job
    /// must wait (it was queued behind the key's holder).
    fn take_or_queue(&mut self, key: &str, job: Job) -> Option<Job> {
        match self.waiting.get_mut(key) {
            Some(queue) => {
                queue.push_back(job);
                None
            }
            None => {
                self.waiting.insert(key.to_string(), VecDeque::new());
                Some(job)
            }
        }
    }

    /// The holder of `key` is done with it: the next job waiting for it, which now holds it,
    /// or `None` (the key is free).
    fn release(&mut self, key: &str) -> Option<Job> {
        let queue = self.waiting.get_mut(key)?;
        match queue.pop_front() {
            Some(next) => Some(next),
            None => {
                self.waiting.remove(key);
                None
            }
        }
    }

    /// Every job waiting for a key, emptied (closing).
    fn drain(&mut self) -> Vec<Job> {
        self.waiting.drain().flat_map(|(_, q)| q).collect()
    }
}

/// Runs until stopped, recovering with the connection. `started` hears about the first
/// subscription (or its failure).
#[allow(clippy::too_many_arguments)] // the owner's lines, each its own channel end
pub(crate) fn run(
    ctx: &Context,
    order: Option<&OrderBy>,
    jobs: &Sender<Job>,
    stale: &Receiver<Job>,
    settles: &Receiver<Settle>,
    stop: &Receiver<()>,
    timer: &Sender<TimerMsg>,
    mut started: Option<Sender<Result<()>>>,
) -> Result<CloseReport> {
    let lines = Lines {
        jobs,
        queued: stale,
        settles,
        stop,
        timer,
    };
    let mut generation = 0u64;
    loop {
        // Before the first subscription any error is the caller's; after it, only a closed
        // connection or a refusal that retrying cannot fix ends the consumer.
        let first = started.is_some();
        let link = match wait_for_link(ctx, first) {
            Ok(Some(link)) => link,
            Ok(None) => return Ok(CloseReport::default()),
            Err(e) => return fail(&mut started, e),
        };
        generation += 1;
        begin_generation(ctx, generation, stale);
        let channel = match subscribe_channel(ctx, &link) {
            Ok(c) => c,
            Err(e) if first || !e.is_retriable() => return fail(&mut started, e),
            Err(e) => {
                log::warn!("acemq: resubscribing to {} failed: {e}", ctx.who());
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let consumer = match consume_on(ctx, &channel) {
            Ok(c) => c,
            Err(e) if first || !e.is_retriable() => return fail(&mut started, e),
            Err(e) => {
                log::warn!("acemq: resubscribing to {} failed: {e}", ctx.who());
                continue;
            }
        };
        if let Some(tx) = started.take() {
            let _ = tx.send(Ok(()));
        }
        let mut inflight: BTreeMap<u64, Slot> = BTreeMap::new();
        let mut keys = Keys::default();
        let mut state = State {
            inflight: &mut inflight,
            keys: &mut keys,
            order,
        };
        let end = serve(ctx, generation, &channel, &consumer, &mut state, &lines);
        end_subscription(ctx, &end, consumer, inflight.len());
        match end {
            Ok(End::Stop(report)) => {
                let _ = channel.close();
                return Ok(report);
            }
            Ok(End::Lost(_)) => {}
            Err(e) => {
                let _ = channel.close();
                return Err(e);
            }
        }
    }
}

/// Waits for a live link; `None` when stop was asked meanwhile. While recovering it waits on;
/// before the first subscription (`first`) any error is returned, after it only `Closed`.
fn wait_for_link(ctx: &Context, first: bool) -> Result<Option<Arc<Link>>> {
    loop {
        if ctx.stop_requested() {
            return Ok(None);
        }
        match ctx.connection.link(Duration::from_millis(250)) {
            Ok(link) => return Ok(Some(link)),
            Err(e @ Error::Closed { .. }) => return Err(e),
            Err(e) if first => return Err(e),
            Err(_) => {}
        }
    }
}

/// A new subscription: its generation makes workers skip and the owner drop what belongs to the
/// old channel. Jobs from the old channel still waiting for a worker are dropped now, so that
/// the hand-off has room for the redeliveries and never blocks this thread (the broker sends at
/// most `prefetch` unsettled on the new channel).
fn begin_generation(ctx: &Context, generation: u64, stale: &Receiver<Job>) {
    ctx.generation.store(generation, Ordering::SeqCst);
    let dropped = stale.try_iter().count();
    if dropped > 0 {
        log::debug!(
            "acemq: dropped {dropped} jobs on {:?} from before the reconnect",
            ctx.queue
        );
    }
}

/// `basic.consume` on the queue with the consumer's options.
fn consume_on<'c>(ctx: &Context, channel: &'c Channel) -> Result<amiquip::Consumer<'c>> {
    let mut arguments = crate::connection::to_table(&ctx.arguments);
    if let Some(next) = ctx.stream_cursor.as_ref().and_then(|c| c.resume_at()) {
        // A stream reader subscribing again after a reconnect goes on where it was, not from
        // the offset it first asked for.
        arguments.insert(
            "x-stream-offset".into(),
            amiquip::AmqpValue::LongLongInt(i64::try_from(next).unwrap_or(i64::MAX)),
        );
    }
    let options = AmqpConsumerOptions {
        exclusive: ctx.exclusive,
        arguments,
        ..AmqpConsumerOptions::default()
    };
    channel
        .basic_consume(ctx.queue.clone(), options)
        .map_err(|e| consume_error(&ctx.queue, e))
}

/// Ends one subscription: cancels the amiquip consumer (unless stop already did) and says why.
fn end_subscription(
    ctx: &Context,
    end: &Result<End>,
    consumer: amiquip::Consumer<'_>,
    unsettled: usize,
) {
    if !matches!(end, Ok(End::Stop(_))) {
        // Stop already cancelled it; see `cancel_and_drain` for why this must run.
        cancel_and_drain(&ctx.queue, &consumer, drop);
    }
    drop(consumer);
    ctx.in_flight.store(0, Ordering::SeqCst);
    if let Ok(End::Lost(why)) = end {
        log::warn!(
            "acemq: consumer of {} lost its channel ({why}); {unsettled} unsettled deliveries \
             will be redelivered; resubscribing",
            ctx.who(),
        );
    }
}

fn fail(started: &mut Option<Sender<Result<()>>>, e: Error) -> Result<CloseReport> {
    match started.take() {
        Some(tx) => {
            let _ = tx.send(Err(e));
            Ok(CloseReport::default())
        }
        None => Err(e),
    }
}

fn subscribe_channel(ctx: &Context, link: &Link) -> Result<Channel> {
    let channel = link.open_channel()?;
    channel
        .qos(0, ctx.prefetch, false)
        .map_err(|e| Error::amqp(format!("setting prefetch on {:?}", ctx.queue), e))?;
    Ok(channel)
}

fn consume_error(queue: &str, e: amiquip::Error) -> Error {
    Error::from_amqp_on("queue", queue, "consuming from", e)
}

/// The channels the owner thread talks through.
pub(crate) struct Lines<'a> {
    /// To the workers.
    pub(crate) jobs: &'a Sender<Job>,
    /// The same hand-off, read by the owner only to take back jobs no worker has started.
    pub(crate) queued: &'a Receiver<Job>,
    /// From the workers and the timer.
    pub(crate) settles: &'a Receiver<Settle>,
    /// From a [`StopHandle`](super::StopHandle).
    pub(crate) stop: &'a Receiver<()>,
    /// To the timer thread.
    pub(crate) timer: &'a Sender<TimerMsg>,
}

/// One subscription's deliveries: in flight, and those waiting for their ordering key.
struct State<'a> {
    inflight: &'a mut BTreeMap<u64, Slot>,
    keys: &'a mut Keys,
    order: Option<&'a OrderBy>,
}

fn serve(
    ctx: &Context,
    generation: u64,
    channel: &Channel,
    consumer: &amiquip::Consumer<'_>,
    state: &mut State<'_>,
    lines: &Lines<'_>,
) -> Result<End> {
    let Lines {
        jobs,
        settles,
        stop,
        ..
    } = *lines;
    let mut report = CloseReport::default();
    loop {
        select! {
            recv(consumer.receiver()) -> msg => match msg {
                Ok(ConsumerMessage::Delivery(d)) => {
                    dispatch(ctx, generation, d, state, jobs);
                }
                Ok(ConsumerMessage::ServerCancelled) => {
                    // The queue was deleted (or the broker cancelled us): finish what is running
                    // and end with a clear error.
                    shutdown(ctx, generation, channel, consumer, state, lines, &mut report);
                    return Err(Error::Cancelled { queue: ctx.queue.clone() });
                }
                Ok(ConsumerMessage::ServerClosedChannel(e)) => return Ok(End::Lost(e.to_string())),
                Ok(ConsumerMessage::ServerClosedConnection(e)) => return Ok(End::Lost(e.to_string())),
                Ok(other) => return Ok(End::Lost(format!("{other:?}"))),
                Err(_) => return Ok(End::Lost("the connection dropped".into())),
            },
            recv(settles) -> s => {
                let Ok(s) = s else { return Ok(End::Lost("workers ended".into())) };
                let mut batch = vec![s];
                batch.extend(settles.try_iter());
                if let Err(e) = settle(ctx, generation, channel, state, jobs, batch, &mut report) {
                    return Ok(End::Lost(e.to_string()));
                }
            },
            recv(stop) -> _ => {
                shutdown(ctx, generation, channel, consumer, state, lines, &mut report);
                return Ok(End::Stop(report));
            },
        }
    }
}

fn dispatch(
    ctx: &Context,
    generation: u64,
    mut d: Delivery,
    state: &mut State<'_>,
    jobs: &Sender<Job>,
) {
    let tag = d.delivery_tag();
    // A message from outside the family with neither `x-acemq-id` nor `message_id` gets a
    // fresh id as it is read, so that its copies carry an identity from here on.
    let mut message = Message::take_delivery(&mut d);
    message.codec = Some(ctx.codec.clone());
    let key = state.order.and_then(|o| o.key_of(&message));
    let hold = key.is_some() && state.order.is_some_and(|o| o.holds_retries());
    state.inflight.insert(
        tag,
        Slot {
            delivery: Some(d),
            done: false,
            key: key.clone(),
        },
    );
    let n = state.inflight.len();
    ctx.in_flight.store(n, Ordering::SeqCst);
    ctx.max_in_flight.fetch_max(n, Ordering::SeqCst);
    let job = Job {
        generation,
        tag,
        message,
        keyed: key.is_some(),
        hold,
    };
    let job = match &key {
        Some(key) => state.keys.take_or_queue(key, job),
        None => Some(job),
    };
    if let Some(job) = job {
        // Never blocks: the channel holds `prefetch` jobs, each an unsettled delivery, and the
        // broker sends no more than that unsettled.
        let _ = jobs.send(job);
    }
}

/// The delivery `tag` no longer holds its key (settled, or its handler is done): the next
/// delivery waiting for the key goes to the workers.
fn release_key(state: &mut State<'_>, tag: u64, jobs: &Sender<Job>) {
    let Some(key) = state.inflight.get_mut(&tag).and_then(|s| s.key.take()) else {
        return;
    };
    if let Some(next) = state.keys.release(&key) {
        let _ = jobs.send(next);
    }
}

/// Applies settlements, then acknowledges: one `multiple` ack for the completed run at the front,
/// single acks for completed deliveries behind a running one.
fn settle(
    ctx: &Context,
    generation: u64,
    channel: &Channel,
    state: &mut State<'_>,
    jobs: &Sender<Job>,
    batch: Vec<Settle>,
    report: &mut CloseReport,
) -> std::result::Result<(), amiquip::Error> {
    for s in batch {
        if s.generation != generation {
            log::info!(
                "acemq: dropping the outcome of a delivery on {:?} from before a reconnect; \
                 the broker redelivers it",
                ctx.queue
            );
            ctx.observer.settled(&Settlement {
                queue: &ctx.queue,
                outcome: "dropped",
                attempt: 0,
                handler_duration: Duration::ZERO,
                message_id: "",
                error: None,
            });
            continue;
        }
        match s.action {
            SettleAction::Ack => {
                release_key(state, s.tag, jobs);
                if let Some(slot) = state.inflight.get_mut(&s.tag) {
                    if slot.delivery.is_some() {
                        slot.done = true;
                    } else {
                        // Acknowledged before its handler ran (at most once): only forget it.
                        state.inflight.remove(&s.tag);
                    }
                }
            }
            SettleAction::Requeue => {
                release_key(state, s.tag, jobs);
                if let Some(slot) = state.inflight.remove(&s.tag) {
                    if !s.started {
                        report.requeued += 1;
                    }
                    if let Some(d) = slot.delivery {
                        d.nack(channel, true)?;
                    }
                }
            }
            SettleAction::Released => release_key(state, s.tag, jobs),
            SettleAction::Again(message) => {
                if state.inflight.contains_key(&s.tag) {
                    let hold = state.order.is_some_and(|o| o.holds_retries());
                    let _ = jobs.send(Job {
                        generation,
                        tag: s.tag,
                        message: *message,
                        keyed: true,
                        hold,
                    });
                }
            }
            SettleAction::AckFirst(reply) => {
                let delivery = state
                    .inflight
                    .get_mut(&s.tag)
                    .and_then(|slot| slot.delivery.take());
                match delivery {
                    Some(d) => {
                        let acked = d.ack(channel);
                        let _ = reply.send(acked.is_ok());
                        acked?;
                    }
                    None => {
                        let _ = reply.send(false);
                    }
                }
            }
        }
    }
    flush_acks(state.inflight, channel)?;
    ctx.in_flight.store(state.inflight.len(), Ordering::SeqCst);
    Ok(())
}

fn flush_acks(
    inflight: &mut BTreeMap<u64, Slot>,
    channel: &Channel,
) -> std::result::Result<(), amiquip::Error> {
    // Only slots still holding their delivery are ever `done` (one acknowledged ahead of its
    // handler is forgotten when it settles), and a held or running delivery is never `done`:
    // the `multiple` ack covers exactly the completed run at the front.
    let mut last_front = None;
    while let Some(entry) = inflight.first_entry() {
        if !entry.get().done {
            break;
        }
        last_front = entry.remove().delivery;
    }
    if let Some(d) = last_front {
        d.ack_multiple(channel)?;
    }
    let behind: Vec<u64> = inflight
        .iter()
        .filter(|(_, s)| s.done)
        .map(|(t, _)| *t)
        .collect();
    for tag in behind {
        if let Some(Some(d)) = inflight.remove(&tag).map(|s| s.delivery) {
            d.ack(channel)?;
        }
    }
    Ok(())
}

/// Cancels `consumer` and reads its receiver until amiquip reports the cancel, handing any
/// delivery that was still on its way to `on_delivery`.
///
/// amiquip answers the cancel RPC first and only then sends `ClientCancelled` to the
/// consumer's receiver; if the receiver is gone by then, amiquip's I/O thread treats it as an
/// internal error and **drops the whole connection**. So an amiquip consumer must never be
/// dropped before this has run (amiquip's own `Drop` cancels without waiting).
pub(crate) fn cancel_and_drain(
    queue: &str,
    consumer: &amiquip::Consumer<'_>,
    mut on_delivery: impl FnMut(Delivery),
) {
    if let Err(e) = consumer.cancel() {
        // The channel or connection is gone: nothing more will be sent to the receiver.
        log::debug!("acemq: cancelling the consumer of {queue:?}: {e}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(ConsumerMessage::Delivery(d)) = consumer.receiver().recv_deadline(deadline) {
        on_delivery(d);
    }
}

/// Stop: cancel, requeue what was delivered but not started (on its way, waiting in the
/// hand-off, or held by the timer), let running handlers finish up to the deadline and settle
/// them. What is still running then is `abandoned`; what never started is `requeued`.
fn shutdown(
    ctx: &Context,
    generation: u64,
    channel: &Channel,
    consumer: &amiquip::Consumer<'_>,
    state: &mut State<'_>,
    lines: &Lines<'_>,
    report: &mut CloseReport,
) {
    let settles = lines.settles;
    ctx.stopping.store(true, Ordering::SeqCst);
    // Held retries go back to the queue unchanged; the timer answers on `settles`.
    let _ = lines
        .timer
        .send_timeout(TimerMsg::Stop, super::timer::STOP_TIMEOUT);
    // Deliveries that were on their way before the cancel: back to the queue.
    cancel_and_drain(&ctx.queue, consumer, |d| {
        if d.nack(channel, true).is_ok() {
            report.requeued += 1;
        }
    });
    // Jobs no worker has taken yet, and those waiting for their ordering key: back to the queue
    // now, not counted as running.
    let waiting = state.keys.drain();
    for job in lines.queued.try_iter().chain(waiting) {
        if job.generation != generation {
            continue;
        }
        if let Some(Some(d)) = state.inflight.remove(&job.tag).map(|s| s.delivery) {
            if d.nack(channel, true).is_ok() {
                report.requeued += 1;
            }
        }
    }
    let deadline = Instant::now() + ctx.shutdown_timeout;
    while !state.inflight.is_empty() {
        match settles.recv_deadline(deadline) {
            Ok(s) => {
                let mut batch = vec![s];
                batch.extend(settles.try_iter());
                for s in &batch {
                    if s.generation == generation && s.started {
                        report.finished += 1;
                    }
                }
                if let Err(e) = settle(ctx, generation, channel, state, lines.jobs, batch, report) {
                    log::warn!("acemq: settling while closing {}: {e}", ctx.who());
                    break;
                }
            }
            Err(_) => break,
        }
    }
    // Every handler still running (also one on a delivery from before a reconnect, which is
    // not among this subscription's deliveries): closing does not wait for it.
    report.abandoned = ctx.running.load(Ordering::SeqCst);
    if report.abandoned > 0 {
        log::warn!(
            "acemq: {} deliveries on {} were still being handled after {:?}; the broker \
             requeues them when the channel closes",
            report.abandoned,
            ctx.who(),
            ctx.shutdown_timeout
        );
    }
    state.inflight.clear();
}
