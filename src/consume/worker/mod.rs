//! Worker threads: take a delivery ([`Source`]: straight from amiquip's consumer buffer, or from
//! the owner for an ordered handler), run the handler, turn its result into a verdict, publish
//! the copy the verdict needs (a retry rung, `.dlq`, `.parked`) **before** the original is
//! acknowledged, and send the settlement (with the delivery) back to the owner thread, which
//! acknowledges. A wait spent in the consumer is handed to the timer thread (`ladder/timer.rs`) with the
//! delivery still unacknowledged: the worker goes on at once.

pub(in crate::consume) mod at_most_once;
pub(in crate::consume) mod batches;
pub(in crate::consume) mod source;
pub(in crate::consume) mod step;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::outcome::Handler;
use super::threads::context::Context;
use super::threads::protocol::{Job, Settle, TimerMsg};
use at_most_once::at_most_once;
use batches::run_batches;
use source::{Next, Source};
use step::{admit, finish, intercepted, judge, Watch};

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
    if let Some(hook) = &ctx.hook {
        hook.before_handler(&job.message);
    }
    // The message's trace is current while its handler runs and its copy is published.
    let mut watch = Watch::start(ctx, &job.message);
    let started = Instant::now();
    // The delivery is held where a consumer closing past its deadline can give it back
    // (`abandon.rs`) while the handler runs.
    let parked = job.park(ctx);
    ctx.running.fetch_add(1, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(|| {
        intercepted(ctx, &mut watch.intercept, handler, &parked.message)
    }));
    ctx.running.fetch_sub(1, Ordering::SeqCst);
    let Some(job) = parked.unpark(ctx) else {
        // Abandoned: the closing consumer gave the message back; its result is dropped (and so
        // is anything the hook would have published before its ack).
        if let Some(hook) = &ctx.hook {
            drop(hook.after_handler(false));
        }
        return;
    };
    let verdict = judge(ctx, &job, result);
    finish(ctx, job, (verdict, started.elapsed()), watch, settle, timer);
}
