//! Starting a consumer's threads (`run_on`): the owner on the calling thread, the workers and the
//! timer on scoped threads, and the channels between them.

pub(in crate::consume) mod abandon;
pub(in crate::consume) mod context;
pub(in crate::consume) mod protocol;

use crossbeam_channel::{Receiver, Sender};

use super::flow::control::{Control, Ended, Started};
use super::ladder::timer::{self, STOP_TIMEOUT};
use super::outcome::Handler;
use super::report::CloseReport;
use super::worker::source::Source;
use crate::consume::owner;
use crate::consume::worker;
use crate::error::{Error, Result};
use context::Context;
use protocol::{Job, Settle, TimerMsg};

/// What reaches a running consumer from outside: a stop, and the application's flow control
/// (`flow.rs`).
pub(super) struct Outer<'a> {
    pub(super) stop: &'a Receiver<()>,
    pub(super) control: &'a Receiver<Control>,
}

/// Runs one subscription's life — the owner on this thread, the workers on scoped threads —
/// until it is stopped, fails, or a [`Control`] ends it (then it says which, with the report of
/// that subscription's end). `started` hears of the first subscription (a failure to subscribe
/// is fatal while it is there, unless `retry_first`). With `done`, a final end (a stop or a
/// failure) is reported there as soon as the owner is done — before waiting for handlers still
/// running past the deadline — and `Ended::Closed` returned with an empty report.
pub(super) fn run_on<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    outer: &Outer<'_>,
    started: Option<Started>,
    done: Option<&Sender<Result<CloseReport>>>,
) -> Result<Ended> {
    let concurrency = ctx.concurrency();
    let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(usize::from(ctx.prefetch()));
    let (settle_tx, settle_rx) = crossbeam_channel::unbounded::<Settle>();
    // Each held retry is an unsettled delivery, so the prefetch bounds the timer's input too.
    let (timer_tx, timer_rx) =
        crossbeam_channel::bounded::<TimerMsg>(usize::from(ctx.prefetch()) + 1);
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
            stop: outer.stop,
            control: outer.control,
            timer: &timer_tx,
        };
        let result = owner::run(ctx, order, &lines, started);
        drop(run_inline);
        drop(feeds);
        drop(jobs_rx);
        drop(jobs_tx);
        let _ = timer_tx.send_timeout(TimerMsg::Stop, STOP_TIMEOUT);
        drop(timer_tx);
        match (done, result) {
            (_, Ok(ended @ Ended::Control(..))) => Ok(ended),
            (Some(done), result) => {
                let _ = done.try_send(result.map(|ended| ended.report()));
                Ok(Ended::Closed(CloseReport::default()))
            }
            (None, result) => result,
        }
    })
}
