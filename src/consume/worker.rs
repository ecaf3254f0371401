//! Worker threads: take a delivery ([`Source`]: straight from amiquip's consumer buffer, or from
//! the owner for an ordered handler), run the handler, turn its result into a verdict, publish
//! the copy the verdict needs (a retry rung, `.dlq`, `.parked`) **before** the original is
//! acknowledged, and send the settlement (with the delivery) back to the owner thread, which
//! acknowledges. A wait spent in the consumer is handed to the timer thread (`timer.rs`) with the
//! delivery still unacknowledged: the worker goes on at once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use amiquip::ConsumerMessage;
use crossbeam_channel::{select, Receiver, Sender};

use super::outcome::{
    decide, retry_failed, trimmed_reason, Handler, HandlerResult, Verdict, IN_PROGRESS_FAILED,
};
use super::retry::NextWait;
use super::timer::{Delayed, TimerMsg};
use super::{Context, Job, Settle, SettleAction};
use crate::envelope::{now_ms, Message};
use crate::error::{Error, Result};
use crate::names::{dead_letter_queue, parked_queue, retry_queue};
use crate::observe::Settlement;

/// One subscription's buffer of deliveries, handed by the owner to each worker that reads it
/// itself (a clone of amiquip's receiver; amiquip's consumer itself stays on the owner thread).
pub(crate) struct Feed {
    pub(crate) generation: u64,
    pub(crate) deliveries: Receiver<ConsumerMessage>,
}

/// Where a worker takes its deliveries.
pub(crate) enum Source {
    /// From the owner, which decides what may run (an ordered handler).
    Owner(Receiver<Job>),
    /// Straight from the subscription's buffer: no thread between amiquip's I/O thread and the
    /// handler. `current` is the subscription being read; a new one arrives on `feeds` after a
    /// reconnect, and `feeds` closes when the consumer ends.
    Direct {
        feeds: Receiver<Feed>,
        current: Option<Feed>,
    },
}

/// What [`Source::next`] found. (A job is moved out once per delivery; boxing it would cost an
/// allocation per delivery instead.)
#[allow(clippy::large_enum_variant)]
enum Next {
    Job(Job),
    /// The deadline passed.
    Timeout,
    /// The consumer is ending.
    End,
}

impl Source {
    pub(crate) fn direct(feeds: Receiver<Feed>) -> Source {
        Source::Direct {
            feeds,
            current: None,
        }
    }

    /// The next delivery, waiting until `timeout` fires (`never()`: for ever; one `at(…)` per
    /// batch being gathered, not one per delivery). Reading the
    /// subscription itself, a worker passes anything else it reads there on to the owner as a
    /// [`SettleAction::Signal`], and `None` once the subscription has ended; a delivery from a
    /// subscription that is gone is skipped (the broker redelivers it).
    fn next(
        &mut self,
        ctx: &Context,
        settle: &Sender<Settle>,
        timeout: &Receiver<Instant>,
    ) -> Next {
        let (feeds, current) = match self {
            Source::Owner(jobs) => {
                return select! {
                    recv(jobs) -> job => job.map_or(Next::End, Next::Job),
                    recv(timeout) -> _ => Next::Timeout,
                };
            }
            Source::Direct { feeds, current } => (feeds, current),
        };
        loop {
            let Some(feed) = current.as_ref() else {
                select! {
                    recv(feeds) -> feed => match feed {
                        Ok(feed) => *current = Some(feed),
                        Err(_) => return Next::End,
                    },
                    recv(timeout) -> _ => return Next::Timeout,
                }
                continue;
            };
            let generation = feed.generation;
            let read = select! {
                recv(feed.deliveries) -> msg => msg,
                recv(feeds) -> feed => match feed {
                    Ok(feed) => {
                        *current = Some(feed);
                        continue;
                    }
                    Err(_) => return Next::End,
                },
                recv(timeout) -> _ => return Next::Timeout,
            };
            match read {
                Ok(ConsumerMessage::Delivery(d)) => {
                    if generation != ctx.generation.load(Ordering::SeqCst) {
                        continue;
                    }
                    return Next::Job(Job::taken(ctx, generation, d));
                }
                Ok(other) => {
                    let _ = settle.send(signal(generation, Some(Box::new(other))));
                }
                Err(_) => {
                    // Ended (cancelled, or the channel is gone): wait for the next one.
                    *current = None;
                    let _ = settle.send(signal(generation, None));
                }
            }
        }
    }
}

fn signal(generation: u64, what: Option<Box<ConsumerMessage>>) -> Settle {
    Settle {
        generation,
        tag: 0,
        action: SettleAction::Signal(what),
        started: false,
        delivery: None,
    }
}

pub(crate) fn run<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    mut source: Source,
    settle: Sender<Settle>,
    timer: Sender<TimerMsg>,
) {
    if let Some((max, wait)) = handler.batch_limits().filter(|_| !ctx.at_most_once) {
        return run_batches(ctx, handler, max, wait, source, settle, timer);
    }
    let never = crossbeam_channel::never();
    while let Next::Job(job) = source.next(ctx, &settle, &never) {
        take(ctx, handler, job, &settle, &timer);
    }
}

/// One delivery, start to end: admitted (or put back), handled, its copy published and its
/// settlement sent to the owner (or the timer). On a worker thread, or on the owner's own
/// thread for a consumer that handles inline (see `run_on`).
pub(crate) fn take<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    job: Job,
    settle: &Sender<Settle>,
    timer: &Sender<TimerMsg>,
) {
    let Some(job) = admit(ctx, job, settle) else {
        return;
    };
    if ctx.at_most_once {
        at_most_once(ctx, handler, job, settle);
        return;
    }
    let offset = ctx
        .stream_cursor
        .as_ref()
        .and_then(|c| c.started(&job.message));
    // The message's trace is current while its handler runs and its copy is published.
    let mut watch = Watch::start(ctx, &job.message, offset);
    let (verdict, exhausted, handler_duration) = match past_last_attempt(ctx, &job) {
        Some(verdict) => (verdict, true, Duration::ZERO),
        None => {
            let started = Instant::now();
            ctx.running.fetch_add(1, Ordering::SeqCst);
            let result = catch_unwind(AssertUnwindSafe(|| {
                intercepted(ctx, &mut watch.intercept, handler, &job.message)
            }));
            ctx.running.fetch_sub(1, Ordering::SeqCst);
            (judge(ctx, &job, result), false, started.elapsed())
        }
    };
    let pieces = (verdict, exhausted, handler_duration);
    finish(ctx, job, pieces, watch, settle, timer);
}

/// The batched loop, for a handler with [`Handler::batch_limits`]: up to `max` jobs (no more
/// than this worker's share of the prefetch), the first waited for, the others for at most
/// `wait` after it; one [`Handler::handle_batch`] call; then each settled as in the plain loop.
fn run_batches<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    max: usize,
    wait: Duration,
    mut source: Source,
    settle: Sender<Settle>,
    timer: Sender<TimerMsg>,
) {
    // A batch never waits for more deliveries than the broker lets this worker have unsettled.
    let workers = ctx.concurrency.max(1);
    let max = max.min((usize::from(ctx.prefetch) / workers).max(1)).max(1);
    let never = crossbeam_channel::never();
    let mut ending = false;
    while !ending {
        let Next::Job(first) = source.next(ctx, &settle, &never) else {
            break;
        };
        let mut gathered = vec![first];
        let gathering = crossbeam_channel::at(Instant::now() + wait);
        while gathered.len() < max {
            match source.next(ctx, &settle, &gathering) {
                Next::Job(job) => gathered.push(job),
                Next::Timeout => break,
                Next::End => {
                    ending = true;
                    break;
                }
            }
        }
        let mut batch = Vec::with_capacity(gathered.len());
        for job in gathered {
            let Some(job) = admit(ctx, job, &settle) else {
                continue;
            };
            let offset = ctx
                .stream_cursor
                .as_ref()
                .and_then(|c| c.started(&job.message));
            match past_last_attempt(ctx, &job) {
                Some(verdict) => {
                    let watch = Watch::start(ctx, &job.message, offset);
                    finish(
                        ctx,
                        job,
                        (verdict, true, Duration::ZERO),
                        watch,
                        &settle,
                        &timer,
                    )
                }
                None => batch.push((job, offset)),
            }
        }
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        ctx.running.fetch_add(batch.len(), Ordering::SeqCst);
        let messages: Vec<&Message> = batch.iter().map(|(job, _)| &job.message).collect();
        let results = catch_unwind(AssertUnwindSafe(|| handler.handle_batch(&messages)));
        drop(messages);
        ctx.running.fetch_sub(batch.len(), Ordering::SeqCst);
        let duration = started.elapsed();
        let mut results = match results {
            Ok(results) if results.len() == batch.len() => results.into_iter().map(Some).collect(),
            Ok(results) => {
                log::error!(
                    "acemq: a batch handler returned {} results for {} messages from {:?}; \
                     they will be retried",
                    results.len(),
                    batch.len(),
                    ctx.queue
                );
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        results.resize_with(batch.len(), || None);
        for ((job, offset), result) in batch.into_iter().zip(results) {
            // A batch that panicked as a whole (or answered wrongly) is every message's retry.
            let result = result.unwrap_or_else(|| {
                Err(Box::new("the batch handler panicked or answered wrongly") as _)
            });
            let verdict = judge(ctx, &job, result);
            // The batch ran under no single message's trace; each copy is published under its
            // own message's. The consume interceptors wrap single calls only (see the module
            // docs of `crate::intercept`): a batch handler is not intercepted.
            let watch = Watch::start(ctx, &job.message, offset);
            finish(ctx, job, (verdict, false, duration), watch, &settle, &timer);
        }
    }
}

/// The job, or `None` (and the job dealt with) for a job from an old generation or one that
/// arrives while the consumer is stopping.
fn admit(ctx: &Context, job: Job, settle: &Sender<Settle>) -> Option<Job> {
    if job.generation != ctx.generation.load(Ordering::SeqCst) {
        // From a channel that is gone: the broker redelivers it on the new one.
        log::debug!(
            "acemq: skipping message {} from before a reconnect (it is redelivered)",
            job.message.id()
        );
        return None;
    }
    if ctx.stop_requested() {
        let _ = settle.send(Settle::of(&job, SettleAction::Requeue, false).with(job.delivery));
        return None;
    }
    Some(job)
}

/// The verdict for a message back on this queue past this policy's last attempt after going
/// round this queue's own retry ladder (a consumer of the queue with a longer policy sent it
/// round, or the policy was shortened since): it can never be retried here, so it goes to
/// `.dlq` without running the handler. Any other message reaches the handler whatever its
/// attempt — a consumer of another queue's dead letters (`orders.dlq`, whose messages arrive on
/// `orders`' last attempt) must see them — and a failure of one past the limit is then
/// dead-lettered as exhausted.
fn past_last_attempt(ctx: &Context, job: &Job) -> Option<Verdict> {
    let (attempt, limit) = (job.message.envelope.attempt, ctx.policy.attempts());
    if attempt <= limit || ctx.any_attempt || !round_own_ladder(&job.message, &ctx.queue) {
        return None;
    }
    let plural = if limit == 1 { "" } else { "s" };
    let error = format!("exhausted {limit} attempt{plural}: it arrived at attempt {attempt}");
    Some(Verdict::DeadLetter { error })
}

/// Whether `message` came back to `queue` round `queue`'s own retry ladder, as the family's
/// copies are stamped: a copy of this crate's recording `queue` as the queue that first
/// consumed it (`acemq-original-queue`); a delivery back from one of `queue`'s rungs (they
/// dead-letter through `acemq.retry` with the queue's own name as the routing key); or a
/// retry copy waited out in a consumer (published through the default exchange to the queue by
/// name, carrying no `x-acemq-error`). A dead letter of another queue read from that queue's
/// `.dlq` is none of these: it names the other queue, or it carries the reason it was
/// dead-lettered (every library's dead-letter and parked copies do), or the broker's own
/// dead-lettering brought it through an exchange.
fn round_own_ladder(message: &Message, queue: &str) -> bool {
    use crate::envelope::{headers, HeaderValue};
    let consumed_here = match message.headers.get(headers::ORIGINAL_QUEUE) {
        Some(HeaderValue::Text(q)) => q == queue,
        Some(HeaderValue::Bytes(q)) => q == queue.as_bytes(),
        _ => false,
    };
    let Some(received) = &message.received else {
        return consumed_here;
    };
    let from_rung =
        received.exchange == crate::names::RETRY_EXCHANGE && received.routing_key == queue;
    let retried_to_queue = received.exchange.is_empty()
        && received.routing_key == queue
        && message.envelope.error.is_none();
    consumed_here || from_rung || retried_to_queue
}

/// The handler's result as a verdict (a panic logged: it is a retry).
fn judge(ctx: &Context, job: &Job, result: std::thread::Result<HandlerResult>) -> Verdict {
    if result.is_err() {
        log::error!(
            "acemq: handler panicked on message {} from {:?}; it will be retried",
            job.message.id(),
            ctx.queue
        );
    }
    decide(result)
}

/// Publishes the verdict's copy, reports the settlement and sends it to the owner (or the
/// timer).
/// `decided`: the verdict, whether the consumer decided it because no attempt was left (the
/// message arrived past the last one), and how long the handler ran.
fn finish(
    ctx: &Context,
    job: Job,
    decided: (Verdict, bool, Duration),
    watch: Watch<'_>,
    settle: &Sender<Settle>,
    timer: &Sender<TimerMsg>,
) {
    let (verdict, exhausted, handler_duration) = decided;
    let Job {
        generation,
        tag,
        delivery,
        message,
        keyed,
        hold,
    } = job;
    let mut delivery = Some(delivery);
    // A responder's reply, staged by its handler on this thread: it goes to the owner with the
    // request's acknowledgement **now**, before the bookkeeping below, because a caller is
    // waiting for it. A staged reply without an accepted request is dropped (a retry answers
    // again), which the responder counts as not sent.
    if let (Some(reply), Verdict::Accept) = (super::reply::take(), &verdict) {
        let _ = settle.send(Settle {
            generation,
            tag,
            action: SettleAction::Reply(reply),
            started: true,
            delivery: delivery.take(),
        });
    }
    // What the consumer decides, which is not always what the handler answered: a retry with no
    // attempt left is dead-lettered (for the trace and the interceptors).
    let decided = decided_label(ctx, &message, &verdict);
    let (step, copy_error) = match carry_out(ctx, &message, &verdict, hold) {
        // No copy can carry it (its header frame cannot fit, even trimmed): the original is
        // rejected to the queue's own dead-lettering, and the reason reported.
        Ok(Step::Rejected(reason)) => {
            let text = reason.clone();
            (Step::Rejected(reason), Some(text))
        }
        Ok(step) => {
            if let (Some(cursor), Some(offset)) = (&ctx.stream_cursor, watch.offset) {
                // Handled and its copy (if any) confirmed: a resumed reader starts after it.
                cursor.finished(offset);
            }
            // (A copy held for the timer is not published yet: the timer says how it went.)
            if !matches!(
                step,
                Step::Later {
                    copy: Some(_),
                    again: false,
                    ..
                }
            ) {
                ctx.copy_failures.succeeded(message.id());
            }
            (step, None)
        }
        Err(e) => {
            // Put back after a pause that grows with each failure of this message here, so
            // that a copy that cannot be published (its queue deleted, …) never spins.
            let failures = ctx.copy_failures.failed(message.id());
            let pause = copy_failure_pause(failures);
            let text = format!(
                "could not publish the {} copy (failure {failures} here): {e}",
                verdict.label()
            );
            log::error!(
                "acemq: message {} from {:?}: {text}; the original goes back to the queue \
                 in {pause:?}",
                message.id(),
                ctx.queue
            );
            let step = Step::Later {
                due: Instant::now() + pause,
                copy: None,
                again: false,
            };
            (step, Some(text))
        }
    };
    let really = if copy_error.is_some() {
        "copy_failed"
    } else {
        decided
    };
    // The trace tells the handler's own reject (`rejected`) from the consumer's decision that
    // no attempt is left (`dead_lettered`), as the family's spans do.
    let traced = match really {
        "reject" if exhausted || matches!(verdict, Verdict::Retry { .. }) => "exhausted",
        other => other,
    };
    watch.trace.settled(traced);
    watch.intercept.settled(&crate::intercept::Settled {
        outcome: really,
        error: copy_error
            .as_deref()
            .or(verdict.error())
            .map(str::to_string),
    });
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome: if copy_error.is_some() {
            "copy_failed"
        } else {
            verdict.label()
        },
        attempt: message.envelope.attempt,
        handler_duration,
        message_id: message.id(),
        error: copy_error.as_deref().or(verdict.error()),
    });
    let now = |action, delivery: Option<_>| {
        // (Unless it went with the reply above.)
        if let Some(delivery) = delivery {
            let _ = settle.send(Settle {
                generation,
                tag,
                action,
                started: true,
                delivery: Some(delivery),
            });
        }
    };
    match step {
        Step::Now(action) => now(action, delivery),
        Step::Rejected(_) => now(SettleAction::Reject, delivery),
        Step::Later { due, copy, again } => {
            // Only an accepted request's delivery went with its reply, and acceptance is never
            // a delay.
            let Some(delivery) = delivery else { return };
            if keyed && !again {
                // Its handler is done: later messages with its key need not wait for the
                // delivery to be settled (the retry comes back as a new delivery anyway).
                let _ = settle.send(Settle {
                    generation,
                    tag,
                    action: SettleAction::Released,
                    started: true,
                    delivery: None,
                });
            }
            let delayed = Box::new(Delayed {
                generation,
                tag,
                delivery,
                due,
                attempt: message.envelope.attempt,
                copy: copy.map(|c| *c),
                again,
            });
            if let Err(e) = timer.send(TimerMsg::Delay(delayed)) {
                // The timer is gone (the consumer is ending): put the original back.
                if let TimerMsg::Delay(d) = e.into_inner() {
                    let _ = settle.send(Settle {
                        generation: d.generation,
                        tag: d.tag,
                        action: SettleAction::Requeue,
                        started: true,
                        delivery: Some(d.delivery),
                    });
                }
            }
        }
    }
}

/// What follows one message from its handler to its settlement: its trace context (current on
/// this thread until its copy is published) and the consume interceptors' settlement listeners.
struct Watch<'a> {
    trace: crate::trace::Consuming,
    intercept: crate::intercept::ConsumeContext<'a>,
    /// On a stream, its offset: finished once its copy (if any) is confirmed.
    offset: Option<u64>,
}

impl<'a> Watch<'a> {
    fn start(ctx: &'a Context, message: &Message, offset: Option<u64>) -> Watch<'a> {
        Watch {
            trace: crate::trace::Consuming::start(message, &ctx.queue),
            intercept: crate::intercept::ConsumeContext::new(&ctx.queue),
            offset,
        }
    }
}

/// The label of what the consumer does with a verdict: a retry that the policy has no attempt
/// (or age) left for is dead-lettered (`reject`).
fn decided_label(ctx: &Context, message: &Message, verdict: &Verdict) -> &'static str {
    if let Verdict::Retry { .. } = verdict {
        let age_ms =
            u64::try_from(now_ms().saturating_sub(message.envelope.first_seen_ms)).unwrap_or(0);
        if !matches!(
            ctx.policy
                .next_wait(message.envelope.attempt, Duration::from_millis(age_ms)),
            NextWait::Wait(_)
        ) {
            return "reject";
        }
    }
    verdict.label()
}

/// The handler, inside the connection's consume interceptors (outermost first).
fn intercepted<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    intercept: &mut crate::intercept::ConsumeContext<'_>,
    handler: &H,
    message: &Message,
) -> crate::consume::HandlerResult {
    let interceptors = &ctx.connection.shared.options.consume_interceptors;
    if interceptors.is_empty() {
        return handler.handle(message);
    }
    crate::intercept::run_consume(interceptors, intercept, message, &|m| handler.handle(m))
}

/// At most once: the delivery is acknowledged (the owner answers once the ack is out) before
/// the handler runs; whatever the handler decides then, nothing is copied: a failure is counted
/// and reported as `lost`.
fn at_most_once<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    job: Job,
    settle: &Sender<Settle>,
) {
    let (question, answer) = super::AckAhead::ask(&job.message);
    let Job {
        generation,
        tag,
        delivery,
        message,
        ..
    } = job;
    // (Not sent: the owner is gone, and the question, dropped, answers "not acknowledged".)
    let _ = settle.send(Settle {
        generation,
        tag,
        action: SettleAction::AckFirst(question),
        started: false,
        delivery: Some(delivery),
    });
    let wait = ctx.ack_first_wait;
    match answer.wait(wait) {
        Some(true) => {}
        Some(false) => {
            // The channel went away before the ack: the broker delivers it again (or the
            // consumer is ending). Running it now could run it twice.
            log::debug!(
                "acemq: message {} from {:?} was not acknowledged ahead of its handler; not \
                 running it",
                message.id(),
                ctx.queue
            );
            return;
        }
        None => {
            // Whether the ack went out is not known yet: running the handler could run it
            // twice (if it did not, the broker delivers it again). If it did, the owner counts
            // the message lost when the broker's word comes.
            log::warn!(
                "acemq: message {} from {:?}: no word within {wait:?} that its acknowledgement \
                 went out; not running it (it is counted lost if the acknowledgement did go \
                 out)",
                message.id(),
                ctx.queue
            );
            return;
        }
    }
    let trace = crate::trace::Consuming::start(&message, &ctx.queue);
    let mut intercept = crate::intercept::ConsumeContext::new(&ctx.queue);
    let started = Instant::now();
    ctx.running.fetch_add(1, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(|| {
        intercepted(ctx, &mut intercept, handler, &message)
    }));
    ctx.running.fetch_sub(1, Ordering::SeqCst);
    let handler_duration = started.elapsed();
    let reply = super::reply::take();
    let verdict = decide(result);
    let error = match &verdict {
        Verdict::Accept => None,
        other => Some(format!(
            "lost (at most once): the handler's outcome was {}{}",
            other.label(),
            other.error().map(|e| format!(": {e}")).unwrap_or_default()
        )),
    };
    if error.is_some() {
        ctx.lost.fetch_add(1, Ordering::SeqCst);
    }
    let outcome = if error.is_some() { "lost" } else { "accept" };
    trace.settled(outcome);
    intercept.settled(&crate::intercept::Settled {
        outcome,
        error: error.clone(),
    });
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome: if error.is_some() { "lost" } else { "accept" },
        attempt: message.envelope.attempt,
        handler_duration,
        message_id: message.id(),
        error: error.as_deref(),
    });
    // Acknowledged already: the owner only counts it settled (and publishes a responder's
    // reply).
    let action = match (error.is_none(), reply) {
        (true, Some(reply)) => SettleAction::Reply(reply),
        _ => SettleAction::Ack,
    };
    let _ = settle.send(Settle {
        generation,
        tag,
        action,
        started: true,
        delivery: None,
    });
}

/// What to do with the original once the verdict's copy is taken care of.
enum Step {
    /// Settle it now.
    Now(SettleAction),
    /// Hold it, unacknowledged; at `due` the timer publishes `copy` to the queue itself and then
    /// acknowledges it, or with no copy puts it back on the queue; with `again`, it hands `copy`
    /// back to the owner to run the handler again on the same delivery.
    Later {
        due: Instant,
        copy: Option<Box<Message>>,
        again: bool,
    },
    /// Reject it without requeueing (to the queue's own dead-lettering, if any): no copy of it
    /// fits the frame limit, not even trimmed; why.
    Rejected(String),
}

/// Publishes the copy a verdict needs, confirmed and mandatory, through the default exchange;
/// `Ok(Step::Now(Ack))` means the original may be acknowledged. With `hold` (an ordered message
/// whose retries keep its key) a retry or in-progress wait is spent in the consumer on the same
/// delivery, whatever its length, and the handler runs again on it.
fn carry_out(ctx: &Context, message: &Message, verdict: &Verdict, hold: bool) -> Result<Step> {
    let attempt = message.envelope.attempt;
    match verdict {
        Verdict::Accept => Ok(Step::Now(SettleAction::Ack)),
        Verdict::Retry { delay, why } => {
            let age_ms =
                u64::try_from(now_ms().saturating_sub(message.envelope.first_seen_ms)).unwrap_or(0);
            match ctx.policy.next_wait(attempt, Duration::from_millis(age_ms)) {
                NextWait::Wait(wait) if hold => {
                    let wait = ctx.policy.jittered(delay.unwrap_or(wait));
                    Ok(run_again(message, wait, attempt.saturating_add(1)))
                }
                NextWait::Wait(wait) => {
                    let wait = delay.unwrap_or(wait);
                    let next = attempt.saturating_add(1);
                    wait_then_copy(ctx, message, (wait, next, true), &retry_failed(why))
                }
                NextWait::Exhausted => {
                    let n = ctx.policy.attempts();
                    let plural = if n == 1 { "" } else { "s" };
                    let error = format!("exhausted {n} attempt{plural}: {why}");
                    dead_letter(ctx, message, &dead_letter_queue(&ctx.queue), error)
                }
                NextWait::TooOld(limit) => {
                    let error = format!(
                        "exceeded the maximum message age of {}: {why}",
                        format_duration(limit)
                    );
                    dead_letter(ctx, message, &dead_letter_queue(&ctx.queue), error)
                }
            }
        }
        Verdict::DeadLetter { error } => {
            dead_letter(ctx, message, &dead_letter_queue(&ctx.queue), error.clone())
        }
        Verdict::Park { error } => {
            dead_letter(ctx, message, &parked_queue(&ctx.queue), error.clone())
        }
        Verdict::InProgress { delay } if hold => Ok(run_again(message, *delay, attempt)),
        Verdict::InProgress { delay } => {
            wait_then_copy(ctx, message, (*delay, attempt, false), IN_PROGRESS_FAILED)
        }
    }
}

/// A held retry: the same delivery, unacknowledged, runs again after `wait` with `attempt`.
fn run_again(message: &Message, wait: Duration, attempt: u32) -> Step {
    let mut again = message.clone();
    again.envelope.attempt = attempt;
    Step::Later {
        due: Instant::now() + wait,
        copy: Some(Box::new(again)),
        again: true,
    }
}

/// A retry (or in-progress) copy with `attempt` after `wait`: on a broker rung when the wait is
/// at least the threshold, else held in the consumer (jittered when `jitter`) and then sent to
/// the queue. A copy whose header frame cannot fit the frame limit is dead-lettered trimmed
/// instead ([`trimmed`]), `failed` saying what could not be done.
fn wait_then_copy(
    ctx: &Context,
    message: &Message,
    (wait, attempt, jitter): (Duration, u32, bool),
    failed: &str,
) -> Result<Step> {
    match wait_then_copy_fitting(ctx, message, wait, attempt, jitter) {
        Err(Error::FrameTooLarge { size, limit, .. }) => {
            let dlq = dead_letter_queue(&ctx.queue);
            trimmed(ctx, message, &dlq, failed, (size, limit))
        }
        done => done,
    }
}

/// [`wait_then_copy`] up to the frame limit: [`Error::FrameTooLarge`] when the copy cannot fit
/// (checked before a copy is held, since its publish comes later).
fn wait_then_copy_fitting(
    ctx: &Context,
    message: &Message,
    wait: Duration,
    attempt: u32,
    jitter: bool,
) -> Result<Step> {
    let mut copy = copy_of(message);
    stamp_origin(&mut copy, message, &ctx.queue);
    copy.envelope.attempt = attempt;
    // A broker wait goes to one of the policy's rungs (declared with the consumer); a policy with
    // none holds it in the consumer: no queue is ever declared for one delay.
    if let Some(rung) = Some(wait)
        .filter(|w| ctx.policy.waits_in_broker(*w))
        .and_then(|w| ctx.policy.rung_for(w))
    {
        let queue = retry_queue(&ctx.queue, rung);
        match publish(ctx, &queue, copy.clone()) {
            Ok(()) => return Ok(Step::Now(SettleAction::Ack)),
            Err(Error::Unroutable { .. }) => {
                // No rung to wait on (not declared here, or deleted): wait in the consumer
                // instead, as the Python library does.
                log::warn!(
                    "acemq: retry queue {queue:?} does not exist; message {} waits {wait:?} in \
                     the consumer instead",
                    message.id()
                );
            }
            Err(e) => return Err(e),
        }
        ctx.publisher.check_held_copy(&ctx.queue, &copy)?;
        return Ok(Step::Later {
            due: Instant::now() + wait,
            copy: Some(Box::new(copy)),
            again: false,
        });
    }
    let wait = if jitter {
        ctx.policy.jittered(wait)
    } else {
        wait
    };
    if wait.is_zero() {
        publish(ctx, &ctx.queue, copy)?;
        return Ok(Step::Now(SettleAction::Ack));
    }
    ctx.publisher.check_held_copy(&ctx.queue, &copy)?;
    Ok(Step::Later {
        due: Instant::now() + wait,
        copy: Some(Box::new(copy)),
        again: false,
    })
}

/// A dead-letter or parked copy: same attempt, `x-acemq-error` set, and no per-message
/// expiration (RabbitMQ strips it when it dead-letters; kept, the copy would silently expire out
/// of `.dlq`).
fn dead_letter(ctx: &Context, message: &Message, queue: &str, error: String) -> Result<Step> {
    match publish(
        ctx,
        queue,
        dead_letter_copy(message, &ctx.queue, error.clone()),
    ) {
        Err(Error::FrameTooLarge { size, limit, .. }) => {
            trimmed(ctx, message, queue, &error, (size, limit))
        }
        published => published.map(|()| Step::Now(SettleAction::Ack)),
    }
}

/// The copy of `message` to `queue` whose header frame (`size` bytes) was over the connection's
/// frame `limit`, sent again trimmed to what must stay: the body, the envelope and the family's
/// headers (`x-acemq-*`, `acemq-*`); the application headers are dropped and named in its
/// `x-acemq-error`, after `reason` (why it is dead-lettered). When even that cannot fit, no
/// copy is sent: the original is rejected without requeueing, to the queue's own dead-lettering
/// (its `x-dead-letter-exchange`, else the broker drops it) — a copy never costs the
/// connection (RabbitMQ closes it over a frame too large) nor loops.
fn trimmed(
    ctx: &Context,
    message: &Message,
    queue: &str,
    reason: &str,
    (size, limit): (usize, usize),
) -> Result<Step> {
    let mut copy = dead_letter_copy(message, &ctx.queue, String::new());
    let dropped: Vec<String> = copy
        .headers
        .keys()
        .filter(|name| !is_family_header(name))
        .cloned()
        .collect();
    copy.headers.retain(|name, _| is_family_header(name));
    let error = trimmed_reason(reason, size, limit, &dropped);
    copy.envelope.error = Some(error.clone());
    match publish(ctx, queue, copy) {
        Ok(()) => {
            log::warn!(
                "acemq: message {} from {:?} went to {queue:?} trimmed: {error}",
                message.id(),
                ctx.queue
            );
            Ok(Step::Now(SettleAction::Ack))
        }
        Err(Error::FrameTooLarge { size, .. }) => {
            let why = format!(
                "rejected without a copy to the queue's own dead-lettering: even trimmed, its \
                 copy to {queue:?} has a header frame of {size} bytes, over the frame limit of \
                 {limit} bytes ({error})"
            );
            log::error!("acemq: message {} from {:?} {why}", message.id(), ctx.queue);
            Ok(Step::Rejected(why))
        }
        Err(e) => Err(e),
    }
}

/// The family's headers, which a trimmed copy keeps: `x-acemq-*` and `acemq-*`.
fn is_family_header(name: &str) -> bool {
    name.starts_with("acemq-") || name.starts_with(crate::envelope::headers::RESERVED_PREFIX)
}

/// The dead-letter (or parked) copy of `message`, consumed from `consumed`, failed with `error`.
pub(crate) fn dead_letter_copy(message: &Message, consumed: &str, error: String) -> Message {
    let mut copy = copy_of(message);
    stamp_origin(&mut copy, message, consumed);
    copy.envelope.error = Some(error);
    copy.expiration_ms = None;
    copy
}

/// What every copy is: the envelope regenerated from the original's (id, type, version,
/// correlation, causation, first-seen, origin and error as they arrived), the application
/// headers with the types they arrived with, the body and content type unchanged.
pub(crate) fn copy_of(original: &Message) -> Message {
    let mut copy = original.clone();
    copy.received = None;
    if let Some(props) = copy.properties.take() {
        // Keep the received table (and only it) for the headers' AMQP types.
        copy.received_headers = props.headers().clone().map(std::sync::Arc::new);
    }
    copy
}

/// Records on a copy where its message was first going — the exchange and routing key of its
/// first publish, and the queue that first consumed it — so that a replay from `.dlq` can send
/// it back there (`patterns::replay`). Each of the three the message arrived with (recorded by
/// whoever copied it first) is kept as it came, and a missing queue is this one. The exchange
/// and routing key are taken from this delivery only when it is the message's first trip: not
/// when an earlier copy recorded an origin already, nor when the delivery is itself a copy (on
/// a later attempt, or back from a retry rung through `acemq.retry`), whose exchange and routing
/// key are the copy's way here, not the first publish. That one is then not known (the family's
/// other libraries do not record it) and left out: a replay sends the message to its queue
/// through the default exchange.
fn stamp_origin(copy: &mut Message, original: &Message, queue: &str) {
    use crate::envelope::{headers, HeaderValue};
    let Some(received) = &original.received else {
        return;
    };
    let names = [
        headers::ORIGINAL_EXCHANGE,
        headers::ORIGINAL_ROUTING_KEY,
        headers::ORIGINAL_QUEUE,
    ];
    let first_trip = !names.iter().any(|n| copy.headers.contains_key(*n))
        && original.envelope.attempt <= 1
        && received.exchange != crate::names::RETRY_EXCHANGE;
    let first = |value: &String| first_trip.then(|| value.clone());
    let values = [
        first(&received.exchange),
        first(&received.routing_key),
        Some(queue.to_string()),
    ];
    for (name, value) in names.into_iter().zip(values) {
        if let (false, Some(value)) = (copy.headers.contains_key(name), value) {
            copy.headers
                .insert(name.to_string(), HeaderValue::Text(value));
        }
    }
}

/// Publishes a copy to `queue` through the default exchange, confirmed and mandatory.
pub(crate) fn publish(ctx: &Context, queue: &str, copy: Message) -> Result<()> {
    publish_copy(&ctx.publisher, queue, copy)
}

/// [`publish`] with a publisher of the caller's (the acknowledged consumer's dead letters).
pub(crate) fn publish_copy(
    publisher: &crate::Publisher,
    queue: &str,
    mut copy: Message,
) -> Result<()> {
    if let Err(invalid) = copy.validate() {
        // A header another client sent that we may not send back (a non-finite float, …):
        // drop what cannot go on the wire rather than requeue the message for ever.
        log::warn!(
            "acemq: message {} has headers that cannot be re-sent ({invalid}); the copy to \
             {queue:?} goes without them",
            copy.id()
        );
        copy.drop_invalid_headers();
    }
    publisher.publish_copy("", queue, copy)
}

/// For the timer: sends `held`, a retry or in-progress copy that waited in the consumer and can
/// never be published as it is, to `.dlq` instead with `error` (trimmed, or no copy and the
/// original rejected, as [`dead_letter`] does over the frame limit); the action for its original.
pub(crate) fn dead_letter_held(
    ctx: &Context,
    held: &Message,
    error: String,
) -> Result<SettleAction> {
    Ok(
        match dead_letter(ctx, held, &dead_letter_queue(&ctx.queue), error)? {
            Step::Now(action) => action,
            Step::Rejected(_) => SettleAction::Reject,
            Step::Later { .. } => SettleAction::Requeue,
        },
    )
}

/// The pause before an original whose copy failed goes back: 1 s, doubling with each failure
/// of the same message here, at most 30 s, drawn between half and all of that (the
/// connection's reconnect back-off).
pub(crate) fn copy_failure_pause(failures: u32) -> Duration {
    crate::connection::backoff(Duration::from_secs(1), Duration::from_secs(30), failures)
}

/// Copy failures per message id on this consumer, for the back-off; bounded (forgotten
/// wholesale past its capacity, which only shortens some pauses).
#[derive(Default)]
pub(crate) struct CopyFailures(parking_lot::Mutex<std::collections::HashMap<String, u32>>);

impl CopyFailures {
    const CAPACITY: usize = 10_000;

    pub(crate) fn failed(&self, id: &str) -> u32 {
        let mut map = self.0.lock();
        if map.len() >= Self::CAPACITY && !map.contains_key(id) {
            map.clear();
        }
        let n = map.entry(id.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn succeeded(&self, id: &str) {
        let mut map = self.0.lock();
        if !map.is_empty() {
            map.remove(id);
        }
    }
}

/// A duration the way Go prints one (`30s`, `2m0s`, `6h0m0s`, `1.5s`): the family's three
/// libraries each print their own way, and this one reads best in a log line.
pub(crate) fn format_duration(d: Duration) -> String {
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let millis = d.subsec_millis();
    let secs = if millis == 0 {
        format!("{s}s")
    } else {
        let frac = format!("{millis:03}");
        format!("{s}.{}s", frac.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::format_duration;
    use std::time::Duration;

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m0s");
        assert_eq!(format_duration(Duration::from_secs(6 * 3600)), "6h0m0s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }
}
