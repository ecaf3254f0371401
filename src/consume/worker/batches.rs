//! The batched worker loop, for a handler with [`Handler::batch_limits`] (the batched
//! `idempotent_tx`): deliveries gathered up to a bound, one [`Handler::handle_batch`] call, then
//! each settled as a single delivery is. While the batch runs, its deliveries are parked where a
//! consumer closing past its deadline can give them back (`abandon.rs`), as a single handler's.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::source::{Next, Source};
use super::step::{admit, finish, judge, Watch};
use crate::consume::outcome::Handler;
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{Settle, TimerMsg};
use crate::envelope::Message;

/// The batched loop, for a handler with [`Handler::batch_limits`]: up to `max` jobs (no more
/// than this worker's share of the prefetch), the first waited for, the others for at most
/// `wait` after it; one [`Handler::handle_batch`] call; then each settled as in the plain loop.
pub(in crate::consume) fn run_batches<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    max: usize,
    wait: Duration,
    mut source: Source,
    settle: Sender<Settle>,
    timer: Sender<TimerMsg>,
) {
    // A batch never waits for more deliveries than the broker lets this worker have unsettled.
    let workers = ctx.concurrency().max(1);
    let max = max
        .min((usize::from(ctx.prefetch()) / workers).max(1))
        .max(1);
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
            if let Some(hook) = &ctx.hook {
                hook.before_handler(&job.message);
            }
            batch.push(job);
        }
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        let parked: Vec<_> = batch.into_iter().map(|job| job.park(ctx)).collect();
        ctx.running.fetch_add(parked.len(), Ordering::SeqCst);
        let messages: Vec<&Message> = parked.iter().map(|p| &p.message).collect();
        let results = catch_unwind(AssertUnwindSafe(|| handler.handle_batch(&messages)));
        drop(messages);
        ctx.running.fetch_sub(parked.len(), Ordering::SeqCst);
        let duration = started.elapsed();
        let mut results = match results {
            Ok(results) if results.len() == parked.len() => results.into_iter().map(Some).collect(),
            Ok(results) => {
                log::error!(
                    "acemq: a batch handler returned {} results for {} messages from {:?}; \
                     they will be retried",
                    results.len(),
                    parked.len(),
                    ctx.queue
                );
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        results.resize_with(parked.len(), || None);
        // Those the closing consumer gave back meanwhile are left out: their results are dropped.
        let batch: Vec<_> = parked
            .into_iter()
            .zip(results)
            .filter_map(|(parked, result)| parked.unpark(ctx).map(|job| (job, result)))
            .collect();
        for (job, result) in batch {
            // A batch that panicked as a whole (or answered wrongly) is every message's retry.
            let result = result.unwrap_or_else(|| {
                Err(Box::new("the batch handler panicked or answered wrongly") as _)
            });
            let verdict = judge(ctx, &job, result);
            // The batch ran under no single message's trace; each copy is published under its
            // own message's. The consume interceptors wrap single calls only (see the module
            // docs of `crate::intercept`): a batch handler is not intercepted.
            let watch = Watch::start(ctx, &job.message);
            finish(ctx, job, (verdict, duration), watch, &settle, &timer);
        }
    }
}
