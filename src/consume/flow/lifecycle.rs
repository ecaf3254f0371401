//! The consumer thread's loop (`run`): one subscription's life after another — ended by a
//! stop, a failure, or the application's flow control (`flow.rs`), which this carries out:
//! wait paused for a resume, or subscribe again at once with a new concurrency or prefetch.

use std::sync::atomic::Ordering;

use crossbeam_channel::{Select, Sender};

use super::control::{Control, Ended, Started};
use crate::consume::outcome::Handler;
use crate::consume::report::CloseReport;
use crate::consume::threads::context::Context;
use crate::consume::threads::{run_on, Outer};
use crate::error::Result;

/// The consumer thread's loop: one subscription's life after another, until a stop or a
/// failure. The final report goes out on `done` (by `run_on`).
pub(in crate::consume) fn run<H: Handler + Sync + ?Sized>(
    ctx: &Context,
    handler: &H,
    outer: &Outer<'_>,
    started: Sender<Result<()>>,
    done: &Sender<Result<CloseReport>>,
) -> Result<()> {
    let mut started = Some(Started {
        tx: started,
        retry: false,
    });
    loop {
        let Ended::Control(report, control) =
            run_on(ctx, handler, outer, started.take(), Some(done))?
        else {
            return Ok(());
        };
        let reply = match control {
            Control::Pause(reply) => {
                ctx.paused.store(true, Ordering::SeqCst);
                let _ = reply.send(report);
                match wait_paused(ctx, outer) {
                    Some(reply) => reply,
                    None => {
                        ctx.paused.store(false, Ordering::SeqCst);
                        let report = CloseReport {
                            handled: ctx.handled.load(Ordering::Relaxed),
                            ..CloseReport::default()
                        };
                        let _ = done.try_send(Ok(report));
                        return Ok(());
                    }
                }
            }
            Control::Scale {
                concurrency,
                prefetch,
                reply,
            } => {
                rescale(ctx, concurrency, prefetch);
                reply
            }
            Control::Resume(reply) => reply,
        };
        ctx.paused.store(false, Ordering::SeqCst);
        // The close set the stop flag; a stop asked meanwhile is still on `outer.stop`, which
        // the next subscription's owner reads first thing.
        ctx.stopping.store(false, Ordering::SeqCst);
        started = Some(Started {
            tx: reply,
            retry: true,
        });
    }
}

/// Paused: waits for a resume (its reply) or a stop (`None`). A scale while paused changes
/// what the next subscription uses.
fn wait_paused(ctx: &Context, outer: &Outer<'_>) -> Option<Sender<Result<()>>> {
    loop {
        let mut select = Select::new();
        let on_control = select.recv(outer.control);
        select.recv(outer.stop);
        let op = select.select();
        if op.index() != on_control {
            let _ = op.recv(outer.stop);
            return None;
        }
        match op.recv(outer.control) {
            Ok(Control::Resume(reply)) => return Some(reply),
            Ok(Control::Pause(reply)) => {
                let _ = reply.send(CloseReport::default());
            }
            Ok(Control::Scale {
                concurrency,
                prefetch,
                reply,
            }) => {
                rescale(ctx, concurrency, prefetch);
                let _ = reply.send(Ok(()));
            }
            // The handle is gone (dropped, which stops the consumer).
            Err(_) => return None,
        }
    }
}

fn rescale(ctx: &Context, concurrency: usize, prefetch: u16) {
    ctx.concurrency_now.store(concurrency, Ordering::SeqCst);
    ctx.prefetch_now.store(prefetch, Ordering::SeqCst);
    log::info!(
        "acemq: consumer of {} subscribes again with concurrency {concurrency} and prefetch \
         {prefetch}",
        ctx.who()
    );
}
