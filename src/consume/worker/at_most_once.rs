//! At most once ([`ConsumerOptions::at_most_once`](super::ConsumerOptions::at_most_once)): the
//! worker has the delivery acknowledged before its handler runs and publishes no copy; the
//! owner's side of a late acknowledgement is [`acked_unhandled`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::step::intercepted;
use crate::consume::outcome::{decide, Handler, Verdict};
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{AckAhead, Job, Settle, SettleAction};
use crate::observe::{Decision, Settlement};

/// At most once: the delivery is acknowledged (the owner answers once the ack is out) before
/// the handler runs; whatever the handler decides then, nothing is copied: a failure is counted
/// and reported as `lost`.
pub(in crate::consume) fn at_most_once<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    job: Job,
    settle: &Sender<Settle>,
) {
    let (question, answer) = AckAhead::ask(&job.message);
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
    let verdict = decide(result);
    let before_ack = ctx
        .hook
        .as_ref()
        .and_then(|h| h.after_handler(verdict == Verdict::Accept));
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
    let outcome = if error.is_some() {
        Decision::Lost
    } else {
        Decision::Accept
    };
    trace.settled(outcome);
    intercept.settled(&crate::intercept::Settled {
        outcome: outcome.as_str(),
        error: error.clone(),
    });
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome,
        attempt: message.envelope.attempt,
        handler_duration,
        message_id: message.id(),
        error: error.as_deref(),
    });
    // Acknowledged already: the owner only counts it settled (and runs a pattern's publish, a
    // responder's reply).
    let action = match (error.is_none(), before_ack) {
        (true, Some(work)) => SettleAction::BeforeAck(work),
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

/// At most once: a delivery the broker has taken the ack of, whose worker had given up waiting
/// to hear so and did not run the handler: lost, and settled.
pub(in crate::consume) fn acked_unhandled(ctx: &Context, question: &AckAhead) {
    ctx.lost.fetch_add(1, Ordering::SeqCst);
    let error = format!(
        "lost (at most once): acknowledged, but the broker's word came after its worker had \
         stopped waiting ({:?}); the handler did not run",
        ctx.ack_first_wait
    );
    log::warn!("acemq: message {} from {}: {error}", question.id, ctx.who());
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome: Decision::Lost,
        attempt: question.attempt,
        handler_duration: Duration::ZERO,
        message_id: &question.id,
        error: Some(&error),
    });
}
