//! The copies a verdict needs — to a retry rung or the queue itself, `.dlq`, `.parked` —
//! published confirmed and mandatory **before** the original is settled ([`carry_out`]); a copy
//! over the frame limit sent trimmed, or the original rejected.

use std::time::{Duration, Instant};

use super::plan::{Plan, SetAside};
use crate::consume::outcome::{retry_failed, trimmed_reason, Verdict, IN_PROGRESS_FAILED};
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::SettleAction;
use crate::envelope::Message;
use crate::error::{Error, Result};
use crate::names::{dead_letter_queue, parked_queue, retry_queue};
use crate::observe::{Retried, RetryWhere, RungMissing, SetAsideFailed};

/// What to do with the original once the verdict's copy is taken care of.
pub(in crate::consume) enum Step {
    /// Settle it now.
    Now(SettleAction),
    /// Hold it, unacknowledged; at `due` the timer publishes `copy` to the queue itself and then
    /// acknowledges it, or with no copy puts it back on the queue; with `again`, it hands `copy`
    /// back to the owner to run the handler again on the same delivery.
    Later {
        due: Instant,
        copy: Option<Box<Message>>,
        again: bool,
        /// `copy` is a fresh copy of the original itself, put back after its copy failed.
        put_back: bool,
    },
    /// Reject it without requeueing (to the queue's own dead-lettering, if any): no copy of it
    /// fits the frame limit, not even trimmed; why.
    Rejected(String),
}

/// Carries out `plan` (decided by [`plan_for`](super::plan::plan_for) from `verdict`): publishes
/// the copy it needs, confirmed and mandatory, through the default exchange;
/// `Ok(Step::Now(Ack))` means the original may be acknowledged.
pub(in crate::consume) fn carry_out(
    ctx: &Context,
    message: &Message,
    verdict: &Verdict,
    plan: Plan,
) -> Result<Step> {
    match plan {
        Plan::Ack => Ok(Step::Now(SettleAction::Ack)),
        Plan::RunAgain {
            wait,
            attempt,
            jitter,
        } => {
            let wait = if jitter {
                let wait = ctx.policy.jittered(wait);
                retried(ctx, message, attempt, wait, RetryWhere::Consumer);
                wait
            } else {
                wait
            };
            Ok(run_again(message, wait, attempt))
        }
        Plan::Copy {
            wait,
            attempt,
            rung,
            retry,
        } => {
            let failed = match verdict {
                Verdict::Retry { why, .. } => retry_failed(why),
                _ => IN_PROGRESS_FAILED.to_string(),
            };
            wait_then_copy(ctx, message, (wait, attempt, rung, retry), &failed)
        }
        Plan::SetAside { to, error, .. } => {
            let queue = match to {
                SetAside::DeadLetter => dead_letter_queue(&ctx.queue),
                SetAside::Parked => parked_queue(&ctx.queue),
            };
            dead_letter(ctx, message, &queue, error)
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
        put_back: false,
    }
}

/// A retry (or in-progress) copy with `attempt` after `wait`: on its broker `rung` when the plan
/// names one, else held in the consumer (jittered for a retry) and then sent to the queue. A
/// copy whose header frame cannot fit the frame limit is dead-lettered trimmed instead
/// ([`trimmed`]), `failed` saying what could not be done.
fn wait_then_copy(
    ctx: &Context,
    message: &Message,
    (wait, attempt, rung, jitter): (Duration, u32, Option<Duration>, bool),
    failed: &str,
) -> Result<Step> {
    // (`jitter` is set for a retry, not for an in-progress wait.)
    match wait_then_copy_fitting(ctx, message, (wait, attempt, rung), jitter) {
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
    (wait, attempt, rung): (Duration, u32, Option<Duration>),
    jitter: bool,
) -> Result<Step> {
    let mut copy = copy_of(message);
    stamp_origin(&mut copy, message, &ctx.queue);
    copy.envelope.attempt = attempt;
    // A retry (`jitter` is set only for one) is reported once its wait is certain: the copy on
    // its rung, or held here.
    let scheduled = |wait, waits| {
        if jitter {
            retried(ctx, message, attempt, wait, waits);
        }
    };
    // A broker wait goes to one of the policy's rungs (declared with the consumer); a policy with
    // none holds it in the consumer: no queue is ever declared for one delay.
    if let Some(rung) = rung {
        let queue = retry_queue(&ctx.queue, rung);
        match publish(ctx, &queue, copy.clone()) {
            Ok(()) => {
                scheduled(wait, RetryWhere::Broker);
                return Ok(Step::Now(SettleAction::Ack));
            }
            Err(Error::Unroutable { .. }) => {
                // No rung to wait on (not declared here, or deleted): wait in the consumer
                // instead, as the Python library does, and say so (`acemq.retry.rung.missing`).
                log::warn!(
                    "acemq: retry queue {queue:?} does not exist; message {} waits {wait:?} in \
                     the consumer instead",
                    message.id()
                );
                ctx.observer.rung_missing(&RungMissing {
                    queue: &ctx.queue,
                    rung: &queue,
                    message_id: message.id(),
                });
            }
            Err(e) => return Err(e),
        }
        let step = held(ctx, copy, wait)?;
        scheduled(wait, RetryWhere::Consumer);
        return Ok(step);
    }
    let wait = if jitter {
        ctx.policy.jittered(wait)
    } else {
        wait
    };
    let step = if wait.is_zero() {
        publish(ctx, &ctx.queue, copy)?;
        Step::Now(SettleAction::Ack)
    } else {
        held(ctx, copy, wait)?
    };
    scheduled(wait, RetryWhere::Consumer);
    Ok(step)
}

/// A dead-letter or parked copy: same attempt, `x-acemq-error` set, and no per-message
/// expiration (RabbitMQ strips it when it dead-letters; kept, the copy would silently expire out
/// of `.dlq`).
fn dead_letter(ctx: &Context, message: &Message, queue: &str, error: String) -> Result<Step> {
    let done = match publish(
        ctx,
        queue,
        dead_letter_copy(message, &ctx.queue, error.clone()),
    ) {
        Err(Error::FrameTooLarge { size, limit, .. }) => {
            trimmed(ctx, message, queue, &error, (size, limit))
        }
        published => published.map(|()| Step::Now(SettleAction::Ack)),
    };
    if let Err(e) = &done {
        // (The caller logs it and backs off; this is the family's count of it.)
        ctx.observer.set_aside_failed(&SetAsideFailed {
            queue: &ctx.queue,
            target: queue,
            message_id: message.id(),
            error: &e.to_string(),
        });
    }
    done
}

/// `copy` held in the consumer for `wait` (checked first: it must be publishable when due).
fn held(ctx: &Context, copy: Message, wait: Duration) -> Result<Step> {
    ctx.publisher.check_held_copy(&ctx.queue, &copy)?;
    Ok(Step::Later {
        due: Instant::now() + wait,
        copy: Some(Box::new(copy)),
        again: false,
        put_back: false,
    })
}

/// Reports another attempt scheduled for `message`: `attempt`, after `wait`, spent `waits`.
pub(in crate::consume) fn retried(
    ctx: &Context,
    message: &Message,
    attempt: u32,
    wait: Duration,
    waits: RetryWhere,
) {
    ctx.observer.retried(&Retried {
        queue: &ctx.queue,
        message_id: message.id(),
        attempt,
        wait,
        waits,
    });
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
    // The broker's count of the original's returns is not the copy's: a copy starts with none
    // (and a stale one would read as returns the broker never counted).
    copy.headers.remove(crate::envelope::DELIVERY_COUNT);
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
