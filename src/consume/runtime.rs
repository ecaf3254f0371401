//! Starting a consumer's threads (`run_on`): the owner on the calling thread, the workers and the
//! timer on scoped threads, and the channels between them.

use crossbeam_channel::{Receiver, Sender};

use super::context::Context;
use super::ladder::timer::{self, STOP_TIMEOUT};
use super::outcome::Handler;
use super::owner;
use super::protocol::{Job, Settle, TimerMsg};
use super::report::CloseReport;
use super::source::Source;
use super::worker;
use crate::error::{Error, Result};

/// Where a spawned consumer reports its first subscription and its close report.
type Spawned = (Sender<Result<()>>, Sender<Result<CloseReport>>);

/// Runs the owner on this thread and the workers on scoped threads. With `spawned`, the first
/// subscription is reported on its first sender and the close report on its second as soon as
/// the owner is done — before waiting for handlers still running past the deadline.
pub(super) fn run_on<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    concurrency: usize,
    handler: &H,
    stop_rx: &Receiver<()>,
    spawned: Option<Spawned>,
) -> Result<CloseReport> {
    let (started, done) = match spawned {
        Some((s, d)) => (Some(s), Some(d)),
        None => (None, None),
    };
    let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(usize::from(ctx.prefetch));
    let (settle_tx, settle_rx) = crossbeam_channel::unbounded::<Settle>();
    // Each held retry is an unsettled delivery, so the prefetch bounds the timer's input too.
    let (timer_tx, timer_rx) =
        crossbeam_channel::bounded::<TimerMsg>(usize::from(ctx.prefetch) + 1);
    // Without ordering each worker reads the subscription itself; the owner hands each one the
    // subscription's buffer on `feeds` (one a reconnect).
    let order = ctx.ordering(handler);
    let direct = order.is_none();
    // Inline (checked by the callers: `check_inline`) there are no workers.
    let workers = if ctx.inline { 0 } else { concurrency };
    let mut feeds = Vec::new();
    std::thread::scope(|s| {
        let spawn_error = |e| Error::Io {
            context: "spawning a consumer thread".into(),
            source: e,
        };
        let settle = settle_tx.clone();
        std::thread::Builder::new()
            .name(ctx.thread_name("acemq-retry-timer"))
            .spawn_scoped(s, move || timer::run(ctx, timer_rx, settle))
            .map_err(spawn_error)?;
        for i in 0..workers {
            let source = if direct {
                let (feed_tx, feed_rx) = crossbeam_channel::unbounded();
                feeds.push(feed_tx);
                Source::direct(feed_rx)
            } else {
                Source::Owner(jobs_rx.clone())
            };
            let (settle, timer) = (settle_tx.clone(), timer_tx.clone());
            std::thread::Builder::new()
                .name(match &ctx.label {
                    Some(label) => format!("acemq-worker-{label}-{i}"),
                    None => format!("acemq-worker-{i}"),
                })
                .spawn_scoped(s, move || worker::run(ctx, handler, source, settle, timer))
                .map_err(spawn_error)?;
        }
        let run_inline = ctx.inline.then(|| {
            let (settle, timer) = (settle_tx.clone(), timer_tx.clone());
            move |job: Job| worker::take(ctx, handler, job, &settle, &timer)
        });
        drop(settle_tx);
        let lines = owner::Lines {
            inline: run_inline.as_ref().map(|run| run as &dyn Fn(Job)),
            jobs: &jobs_tx,
            queued: &jobs_rx,
            feeds: &feeds,
            settles: &settle_rx,
            stop: stop_rx,
            timer: &timer_tx,
        };
        let result = owner::run(ctx, order, &lines, started);
        drop(run_inline);
        drop(feeds);
        drop(jobs_rx);
        drop(jobs_tx);
        let _ = timer_tx.send_timeout(TimerMsg::Stop, STOP_TIMEOUT);
        drop(timer_tx);
        match done {
            Some(done) => {
                let _ = done.try_send(result);
                Ok(CloseReport::default())
            }
            None => result,
        }
    })
}
