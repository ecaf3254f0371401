//! Worker threads: run the handler, turn its result into an outcome, publish the copy an outcome
//! needs (retry, dead-letter, park, in-progress) **before** the original is acknowledged, and
//! send the settlement back to the owner thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::outcome::{decide, Handler, Outcome};
use super::retry::{dead_letter_queue, parked_queue, retry_queue, rung_spec};
use super::{Context, Job, Settle, SettleAction};
use crate::envelope::Message;
use crate::error::Result;
use crate::observe::Settlement;

pub(crate) fn run<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    jobs: Receiver<Job>,
    settle: Sender<Settle>,
) {
    for job in jobs.iter() {
        if job.generation != ctx.generation.load(Ordering::SeqCst) {
            // From a channel that is gone: the broker redelivers it on the new one.
            log::debug!(
                "acemq: skipping message {} from before a reconnect (it is redelivered)",
                job.message.id()
            );
            continue;
        }
        if ctx.stopping.load(Ordering::SeqCst) {
            let _ = settle.send(Settle {
                generation: job.generation,
                tag: job.tag,
                action: SettleAction::Requeue,
                started: false,
            });
            continue;
        }
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| handler.handle(&job.message)));
        let handler_duration = started.elapsed();
        if result.is_err() {
            log::error!(
                "acemq: handler panicked on message {} from {:?}; it will be retried",
                job.message.id(),
                ctx.queue
            );
        }
        let (outcome, error) = decide(result);
        let action = match carry_out(ctx, &job.message, &outcome) {
            Ok(()) => SettleAction::Ack,
            Err(e) => {
                log::error!(
                    "acemq: could not publish the {} copy of message {} from {:?}: {e}; \
                     requeueing the original",
                    outcome.label(),
                    job.message.id(),
                    ctx.queue
                );
                SettleAction::Requeue
            }
        };
        ctx.observer.settled(&Settlement {
            queue: &ctx.queue,
            outcome: outcome.label(),
            attempt: job.message.envelope.attempt,
            handler_duration,
            message_id: job.message.id(),
            error: error.as_deref(),
        });
        let _ = settle.send(Settle {
            generation: job.generation,
            tag: job.tag,
            action,
            started: true,
        });
    }
}

/// Publishes the copy an outcome needs, confirmed and mandatory; `Ok` means the original may be
/// acknowledged.
fn carry_out(ctx: &Context, message: &Message, outcome: &Outcome) -> Result<()> {
    let attempt = message.envelope.attempt;
    match outcome {
        Outcome::Accept => Ok(()),
        Outcome::Retry { delay, reason } => {
            let next = if attempt >= ctx.policy.attempts() {
                None
            } else {
                delay.or_else(|| ctx.policy.delay_after(attempt))
            };
            match next {
                Some(delay) => {
                    let rung = ensure_rung(ctx, delay)?;
                    publish_copy(ctx, message, &rung, attempt.saturating_add(1), Some(reason))
                }
                None => {
                    let why = format!("gave up after {attempt} attempts: {reason}");
                    publish_copy(
                        ctx,
                        message,
                        &dead_letter_queue(&ctx.queue),
                        attempt,
                        Some(&why),
                    )
                }
            }
        }
        Outcome::Reject { reason } => publish_copy(
            ctx,
            message,
            &dead_letter_queue(&ctx.queue),
            attempt,
            Some(reason),
        ),
        Outcome::Park { reason } => publish_copy(
            ctx,
            message,
            &parked_queue(&ctx.queue),
            attempt,
            Some(reason),
        ),
        Outcome::InProgress { delay } => {
            let rung = ensure_rung(ctx, *delay)?;
            publish_copy(ctx, message, &rung, attempt, None)
        }
    }
}

/// The retry queue for `delay`, declared on first use when the consumer declares its topology.
fn ensure_rung(ctx: &Context, delay: Duration) -> Result<String> {
    let name = retry_queue(&ctx.queue, delay);
    if ctx.declare {
        let mut declared = ctx.declared_rungs.lock();
        if !declared.contains(&name) {
            ctx.connection
                .declare_queue(&rung_spec(&ctx.queue, delay))?;
            declared.insert(name.clone());
        }
    }
    Ok(name)
}

fn publish_copy(
    ctx: &Context,
    original: &Message,
    queue: &str,
    attempt: u32,
    error: Option<&str>,
) -> Result<()> {
    let mut copy = original.clone();
    copy.received = None;
    copy.properties = None;
    copy.envelope.attempt = attempt;
    if let Some(e) = error {
        copy.envelope.error = Some(e.to_string());
    }
    if let Err(invalid) = copy.validate() {
        // A header another client sent that we may not send back (a non-finite float, …):
        // drop what cannot go on the wire rather than requeue the message for ever.
        log::warn!(
            "acemq: message {} has headers that cannot be re-sent ({invalid}); the copy to \
             {queue:?} goes without them",
            original.id()
        );
        copy.drop_invalid_headers();
    }
    ctx.publisher.publish("", queue, copy)
}
