//! The unconfirmed publisher's thread (`acemq-flush`): releases what was handed over once the
//! broker is known to have read it, and counts what the broker returned.
//!
//! Without confirms nothing tells a publisher that the broker took a message, yet what was
//! handed over must stay bounded: amiquip's I/O thread buffers frames without a bound of its
//! own (and blocks the publishing thread, with no deadline, past its high-water mark). So each
//! publish keeps its bytes in the connection's budget and its place in the window until a
//! **round trip** on its channel ([`Channel::round_trip`](crate::transport::Channel::round_trip))
//! comes back: the broker handles a channel's frames in order, so its answer means every
//! publish numbered before it was read off the socket, routed, and any `basic.return` for it
//! already queued. The round trip runs here, under the channel's lock, never on a caller's
//! thread (it waits as long as the broker does not read: a memory alarm); callers wait for
//! room with their deadline meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvError, Select};

use super::state::{channel_failure, fail_all, note_missing, Control, Shared};
use crate::error::Error;
use crate::observe::{PublishEvent, PublishOutcome};
use crate::transport::{Feed, Return};

/// How long publishes may wait for their round trip when nothing asks for one sooner.
const LINGER: Duration = Duration::from_millis(2);

/// How long a round trip waits for the channel's lock (a publish being handed over) before it
/// gives way and is tried again.
const CHANNEL_WAIT: Duration = Duration::from_millis(100);

/// The flush thread: round trips while publishes are outstanding, returns counted.
pub(super) fn flush_loop(
    shared: &Shared,
    control: &Receiver<Control>,
    kick: &Receiver<()>,
    wake: &Receiver<()>,
) {
    let mut epoch = 0u64;
    let mut returns: Feed<Return> = Feed::never();
    loop {
        let outstanding = !shared.state.lock().pending.is_empty();
        match next(control, &returns, kick, wake, outstanding) {
            Event::Control(Ok(Control::Channel {
                epoch: e,
                returns: r,
                ..
            })) => {
                epoch = e;
                returns = r;
            }
            Event::Control(Ok(Control::Stop) | Err(_)) => {
                // What is still outstanding (a publisher dropped without `close`): one last
                // round trip lets it go quietly if the broker reads.
                round_trip(shared, epoch, &returns);
                let mut state = shared.state.lock();
                state.closed = true;
                fail_all(&mut state, &shared.observer, |_| Error::Closed {
                    what: "publisher",
                });
                shared.room.notify_all();
                return;
            }
            Event::Return(Ok(r)) => count_returned(shared, &r),
            Event::Return(Err(_)) => {
                // The channel ended: the round trip learns why and lets its publishes go.
                returns = Feed::never();
                round_trip(shared, epoch, &returns);
            }
            Event::Due => round_trip(shared, epoch, &returns),
            Event::Wake => {} // outstanding now: wait the linger
        }
    }
}

/// What the flush thread waits for, whichever comes first.
#[allow(clippy::large_enum_variant)] // moved once, straight to its match: boxing would cost more
enum Event {
    Control(Result<Control, RecvError>),
    Return(Result<Return, RecvError>),
    /// A caller asked for a round trip, or publishes waited `LINGER` for one.
    Due,
    /// A publish is outstanding where none was.
    Wake,
}

fn next(
    control: &Receiver<Control>,
    returns: &Feed<Return>,
    kick: &Receiver<()>,
    wake: &Receiver<()>,
    outstanding: bool,
) -> Event {
    let mut select = Select::new();
    let on_control = select.recv(control);
    let on_return = returns.register(&mut select);
    let on_kick = select.recv(kick);
    let on_wake = select.recv(wake);
    let op = if outstanding {
        match select.select_timeout(LINGER) {
            Ok(op) => op,
            Err(_) => return Event::Due,
        }
    } else {
        select.select()
    };
    match op.index() {
        i if i == on_control => Event::Control(op.recv(control)),
        i if i == on_return => Event::Return(returns.read(op)),
        i if i == on_kick => {
            let _ = op.recv(kick);
            Event::Due
        }
        i if i == on_wake => {
            let _ = op.recv(wake);
            Event::Wake
        }
        _ => Event::Due,
    }
}

/// A mandatory publish the broker could not route: counted, told to the observer, logged (the
/// first at warn, the rest at debug). Its caller was answered when it was handed over.
fn count_returned(shared: &Shared, r: &Return) {
    let n = shared.returned.fetch_add(1, Ordering::Relaxed) + 1;
    shared.observer.publish_answered(&PublishEvent {
        exchange: &r.exchange,
        routing_key: &r.routing_key,
        outcome: PublishOutcome::Unroutable,
        duration: None,
    });
    let id = r.properties.message_id().clone().unwrap_or_default();
    let text = format!(
        "acemq: unconfirmed publish {id:?} to {:?} with routing key {:?} was returned \
         unroutable ({} {}); {n} so far on this publisher (Publisher::unroutable)",
        r.exchange, r.routing_key, r.reply_code, r.reply_text
    );
    if n == 1 {
        log::warn!("{text}");
    } else {
        log::debug!("{text}");
    }
}

/// One round trip on the current channel (of `epoch`): on its answer, the returns it flushed
/// are counted and every publish numbered before it is released; on an error the channel is
/// gone, and its publishes with it (said once, at warn).
fn round_trip(shared: &Shared, epoch: u64, returns: &Feed<Return>) {
    let slot = {
        let state = shared.state.lock();
        match state.current.as_ref() {
            Some(current) if state.epoch == epoch && !state.pending.is_empty() => {
                current.channel.clone()
            }
            _ => return,
        }
    };
    // Under the channel's lock every publish numbered so far has been handed over: a caller
    // numbers its publish and hands it over while holding that lock.
    let Some(mut guard) = slot.try_lock_for(CHANNEL_WAIT) else {
        return; // a hand-over is slow (the broker is not reading): next time
    };
    let upto = {
        let state = shared.state.lock();
        match state.current.as_ref() {
            Some(current) if state.epoch == epoch => current.next_tag.saturating_sub(1),
            _ => return,
        }
    };
    let Some(channel) = guard.as_ref() else {
        return; // a hand-over found it broken and is failing its publishes
    };
    match channel.round_trip() {
        Ok(()) => {
            drop(guard);
            while let Ok(r) = returns.try_recv() {
                count_returned(shared, &r);
            }
            let released = {
                let mut state = shared.state.lock();
                if state.epoch != epoch {
                    return;
                }
                let rest = state.pending.split_off(&(upto + 1));
                let released = std::mem::replace(&mut state.pending, rest);
                shared.room.notify_all();
                released
            };
            // Their bytes go back to the connection's budget here, outside the state lock.
            drop(released);
        }
        Err(e) => {
            let failure = channel_failure(guard.take(), e);
            let mut state = shared.state.lock();
            if state.epoch == epoch {
                state.current = None;
                note_missing(&mut state, &failure);
                fail_all(&mut state, &shared.observer, |p| {
                    failure.error_for(&p.exchange)
                });
                shared.room.notify_all();
            }
            drop(state);
            drop(guard);
        }
    }
}
