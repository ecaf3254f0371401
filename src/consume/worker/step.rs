//! One delivery's way through a worker, in pieces the plain, batched and inline paths share:
//! admitted (or put back), judged, its copy published and its settlement sent ([`finish`]),
//! with its trace and the consume interceptors around the handler ([`Watch`], [`intercepted`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::consume::ladder::copies::{carry_out, copy_of, retried, Step};
use crate::consume::ladder::copy_failures::copy_failure_pause;
use crate::consume::ladder::plan::plan_for;
use crate::consume::outcome::{decide, Handler, HandlerResult, Verdict};
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{Delayed, Job, Settle, SettleAction, TimerMsg};
use crate::envelope::Message;
use crate::observe::{Decision, RetryWhere, Settlement};

/// The job, or `None` (and the job dealt with) for a job from an old generation or one that
/// arrives while the consumer is stopping.
pub(in crate::consume) fn admit(ctx: &Context, job: Job, settle: &Sender<Settle>) -> Option<Job> {
    if job.generation != ctx.generation.load(Ordering::SeqCst) {
        // From a channel that is gone: the broker redelivers it on the new one.
        log::debug!(
            "acemq: skipping message {} from before a reconnect (it is redelivered)",
            job.message.id()
        );
        return None;
    }
    if ctx.stop_requested() {
        let action = SettleAction::PutBack(Box::new(job.message));
        let _ = settle.send(Settle {
            generation: job.generation,
            tag: job.tag,
            action,
            started: false,
            delivery: Some(job.delivery),
        });
        return None;
    }
    Some(job)
}

/// The handler's result as a verdict (a panic logged: it is a retry).
pub(in crate::consume) fn judge(
    ctx: &Context,
    job: &Job,
    result: std::thread::Result<HandlerResult>,
) -> Verdict {
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
/// `decided`: the verdict and how long the handler ran.
pub(in crate::consume) fn finish(
    ctx: &Context,
    job: Job,
    decided: (Verdict, Duration),
    watch: Watch<'_>,
    settle: &Sender<Settle>,
    timer: &Sender<TimerMsg>,
) {
    let (verdict, handler_duration) = decided;
    let Job {
        generation,
        tag,
        delivery,
        message,
        keyed,
        hold,
    } = job;
    let mut delivery = Some(delivery);
    // A pattern's publish before the ack (a responder's reply, staged by its handler on this
    // thread): it goes to the owner with the delivery's acknowledgement **now**, before the
    // bookkeeping below, because a caller is waiting for it. One without an accepted delivery is
    // dropped (a retry answers again).
    let accepted = verdict == Verdict::Accept;
    let before_ack = ctx.hook.as_ref().and_then(|h| h.after_handler(accepted));
    if let (Some(work), true) = (before_ack, accepted) {
        let _ = settle.send(Settle {
            generation,
            tag,
            action: SettleAction::BeforeAck(work),
            started: true,
            delivery: delivery.take(),
        });
    }
    // What the consumer decides, which is not always what the handler answered: a retry with no
    // attempt left is dead-lettered.
    let plan = plan_for(&ctx.policy, &message, &verdict, hold);
    let decided = plan.decision();
    let (step, copy_error) = match carry_out(ctx, &message, &verdict, plan) {
        // No copy can carry it (its header frame cannot fit, even trimmed): the original is
        // rejected to the queue's own dead-lettering, and the reason reported.
        Ok(Step::Rejected(reason)) => {
            let text = reason.clone();
            (Step::Rejected(reason), Some(text))
        }
        Ok(step) => {
            if let Some(hook) = &ctx.hook {
                // Handled and its copy (if any) confirmed (a stream reader resumes after it).
                hook.done(&message);
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
            if decided == Decision::Retry {
                // Its retry copy failed: it comes back as it was, the same attempt, which the
                // family counts as a retry `requeued`.
                let attempt = message.envelope.attempt;
                retried(ctx, &message, attempt, pause, RetryWhere::Requeued);
            }
            // Put back as a fresh copy of itself when the pause is over, never requeued: the
            // broker would count each return (`put_back.rs`), and drop it past its limit.
            let step = Step::Later {
                due: Instant::now() + pause,
                copy: Some(Box::new(copy_of(&message))),
                again: false,
                put_back: true,
            };
            (step, Some(text))
        }
    };
    let decided = if copy_error.is_some() {
        Decision::CopyFailed
    } else {
        decided
    };
    // The trace and the observer tell the handler's own reject (`rejected`) from the consumer's
    // decision that no attempt is left (`dead_lettered`), as the family's spans do.
    watch.trace.settled(decided);
    watch.intercept.settled(&crate::intercept::Settled {
        // The interceptors' word for a dead letter of either kind is `reject`, as before.
        outcome: match decided {
            Decision::DeadLetter => Decision::Reject.as_str(),
            other => other.as_str(),
        },
        error: copy_error
            .as_deref()
            .or(verdict.error())
            .map(str::to_string),
    });
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome: decided,
        attempt: message.envelope.attempt,
        handler_duration,
        message_id: message.id(),
        error: copy_error.as_deref().or(verdict.error()),
    });
    let now = |action, delivery: Option<_>| {
        // (Unless it went with the publish before the ack above.)
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
        Step::Later {
            due,
            copy,
            again,
            put_back,
        } => {
            // Only an accepted delivery went with a publish before its ack, and acceptance is
            // never a delay.
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
                put_back,
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
pub(in crate::consume) struct Watch<'a> {
    pub(in crate::consume) trace: crate::trace::Consuming,
    pub(in crate::consume) intercept: crate::intercept::ConsumeContext<'a>,
}

impl<'a> Watch<'a> {
    pub(in crate::consume) fn start(ctx: &'a Context, message: &Message) -> Watch<'a> {
        Watch {
            trace: crate::trace::Consuming::start(message, &ctx.queue),
            intercept: crate::intercept::ConsumeContext::new(&ctx.queue),
        }
    }
}

/// The handler, inside the connection's consume interceptors (outermost first).
pub(in crate::consume) fn intercepted<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    intercept: &mut crate::intercept::ConsumeContext<'_>,
    handler: &H,
    message: &Message,
) -> HandlerResult {
    let interceptors = &ctx.connection.shared.options.consume_interceptors;
    if interceptors.is_empty() {
        return handler.handle(message);
    }
    crate::intercept::run_consume(interceptors, intercept, message, &|m| handler.handle(m))
}
