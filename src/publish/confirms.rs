//! The confirm thread (`acemq-confirms`): matches the broker's confirms and returns to the
//! pending publishes and answers each caller.

use std::time::Duration;

use crate::transport::{AmqpError, Confirm, Feed, Return};
use crossbeam_channel::{Receiver, RecvError, Select};

use super::state::{channel_failure, fail_all, Control, Shared};
use crate::error::Error;
use crate::observe::{PublishEvent, PublishOutcome};

/// The confirm thread: matches confirms and returns to pending publishes.
pub(super) fn confirm_loop(shared: &Shared, control: &Receiver<Control>) {
    let mut epoch = 0u64;
    let mut confirms: Feed<Confirm> = Feed::never();
    let mut returns: Feed<Return> = Feed::never();
    loop {
        match next(control, &returns, &confirms) {
            Event::Control(msg) => match msg {
                Ok(Control::Channel {
                    epoch: e,
                    confirms: c,
                    returns: r,
                }) => {
                    epoch = e;
                    confirms = c;
                    returns = r;
                }
                Ok(Control::Stop) | Err(_) => {
                    let mut state = shared.state.lock();
                    state.closed = true;
                    fail_all(&mut state, &shared.observer, |_| Error::Closed {
                        what: "publisher",
                    });
                    shared.room.notify_all();
                    return;
                }
            },
            Event::Return(r) => match r {
                Ok(r) => mark_returned(shared, epoch, r),
                Err(_) => returns = Feed::never(),
            },
            Event::Confirm(c) => match c {
                Ok(confirm) => {
                    // Every confirm already queued, resolved under one lock. A return is queued
                    // before the ack of the same message: the returns are drained after the
                    // confirms taken, so each of those confirms finds its return marked.
                    let mut batch = vec![confirm];
                    while batch.len() < CONFIRM_BATCH {
                        match confirms.try_recv() {
                            Ok(c) => batch.push(c),
                            Err(_) => break,
                        }
                    }
                    while let Ok(r) = returns.try_recv() {
                        mark_returned(shared, epoch, r);
                    }
                    resolve(shared, epoch, batch);
                }
                Err(_) => {
                    confirms = Feed::never();
                    returns = Feed::never();
                    // The channel is gone. Its lock is held from taking it out until its
                    // publishes are failed with the broker's reason (learned by closing it,
                    // outside the state lock): a hand-over finding it broken meanwhile waits on
                    // that lock, so neither it nor a new channel fails them without the reason.
                    let slot = {
                        let state = shared.state.lock();
                        match state.current.as_ref() {
                            Some(current) if state.epoch == epoch => Some(current.channel.clone()),
                            _ => None,
                        }
                    };
                    if let Some(slot) = slot {
                        let mut guard = slot.try_lock_for(CHANNEL_FAILURE_WAIT);
                        let channel = guard.as_mut().and_then(|c| c.take());
                        let failure = channel_failure(
                            channel,
                            AmqpError::link_lost("the confirm channel ended"),
                        );
                        let mut state = shared.state.lock();
                        // (A new channel installed meanwhile failed these already.)
                        if state.epoch == epoch {
                            state.current = None;
                            fail_all(&mut state, &shared.observer, |p| {
                                failure.error_for(&p.exchange)
                            });
                            shared.room.notify_all();
                        }
                        drop(state);
                        drop(guard);
                    }
                }
            },
        }
    }
}

/// What the confirm thread waits for, whichever comes first.
#[allow(clippy::large_enum_variant)] // moved once, straight to its match: boxing would cost more
enum Event {
    Control(Result<Control, RecvError>),
    Return(Result<Return, RecvError>),
    Confirm(Result<Confirm, RecvError>),
}

fn next(control: &Receiver<Control>, returns: &Feed<Return>, confirms: &Feed<Confirm>) -> Event {
    let mut select = Select::new();
    let on_control = select.recv(control);
    let on_return = returns.register(&mut select);
    confirms.register(&mut select);
    let op = select.select();
    match op.index() {
        i if i == on_control => Event::Control(op.recv(control)),
        i if i == on_return => Event::Return(returns.read(op)),
        _ => Event::Confirm(confirms.read(op)),
    }
}

fn mark_returned(shared: &Shared, epoch: u64, r: Return) {
    let mut state = shared.state.lock();
    if state.epoch != epoch {
        return;
    }
    // The same message may be pending more than once (one id, several routing keys): a return
    // belongs to the earliest pending publish of that id to that exchange and routing key (the
    // broker returns in publish order, before the ack of the same message).
    let id = r.properties.message_id().clone().unwrap_or_default();
    if let Some(p) = state.pending.values_mut().find(|p| {
        p.returned.is_none()
            && p.message_id == id
            && p.exchange == r.exchange
            && p.routing_key == r.routing_key
    }) {
        p.returned = Some((r.reply_code, r.reply_text));
    } else {
        log::warn!(
            "acemq: a return for message {id:?} to {:?} with routing key {:?} matched no \
             pending publish",
            r.exchange,
            r.routing_key
        );
    }
}

/// The most confirms the confirm thread resolves under one lock.
const CONFIRM_BATCH: usize = 256;

/// How long the confirm thread waits for a broken channel's lock (a publish failing on it) to
/// learn the broker's reason; past it the publishes are failed without it.
const CHANNEL_FAILURE_WAIT: Duration = Duration::from_secs(5);

fn resolve(shared: &Shared, epoch: u64, confirms: Vec<Confirm>) {
    let mut done = Vec::new();
    {
        let mut state = shared.state.lock();
        if state.epoch != epoch {
            return;
        }
        for confirm in confirms {
            let (payload, acked) = match confirm {
                Confirm::Ack(p) => (p, true),
                Confirm::Nack(p) => (p, false),
            };
            if payload.multiple {
                let rest = state.pending.split_off(&(payload.delivery_tag + 1));
                done.extend(
                    std::mem::replace(&mut state.pending, rest)
                        .into_values()
                        .map(|p| (p, acked)),
                );
            } else if let Some(p) = state.pending.remove(&payload.delivery_tag) {
                done.push((p, acked));
            }
        }
        shared.room.notify_all();
    }
    for (p, acked) in done {
        let outcome = match (acked, &p.returned) {
            (true, None) => PublishOutcome::Confirmed,
            (true, Some(_)) => PublishOutcome::Unroutable,
            (false, _) => PublishOutcome::Nacked,
        };
        shared.observer.publish_answered(&PublishEvent {
            exchange: &p.exchange,
            routing_key: &p.routing_key,
            outcome,
            duration: Some(p.started.elapsed()),
        });
        let result = match (acked, p.returned) {
            (true, None) => Ok(()),
            (true, Some((reply_code, reply_text))) => Err(Error::Unroutable {
                exchange: p.exchange.clone(),
                routing_key: p.routing_key,
                message_id: p.message_id,
                reply_code,
                reply_text,
            }),
            (false, _) => Err(Error::Nacked {
                message_id: p.message_id,
            }),
        };
        crate::intercept::tell_answered(p.answered, &result);
        if let Some(reply) = p.reply {
            let _ = reply.send(result);
        }
    }
}
