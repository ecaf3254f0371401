//! The supervisor thread (`acemq-supervisor`): watches the link, reconnects with capped
//! exponential backoff and jitter, re-declares the remembered topology.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::transport::{Blocked, Feed};
use crossbeam_channel::{Receiver, Select};
use parking_lot::Mutex;

use super::connect::connect_any;
use super::link::{close_link, Link};
use super::shared::{Control, LinkState, Shared};
use super::topology::redeclare;
use crate::observe::{ConnectionEvent, Observer};

/// The capped exponential backoff with jitter for reconnect attempt `attempt` (from 1): a delay
/// drawn between half and all of `min * 2^(attempt-1)`, capped at `max`.
pub(crate) fn backoff(min: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = min.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let full = exp.min(max);
    let half = full / 2;
    let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    let r = crate::envelope::random_u64() % jitter_ns.max(1);
    half + Duration::from_nanos(r)
}

/// The supervisor thread's body: watch, recover, repeat.
pub(super) fn supervise(
    weak: Weak<Shared>,
    control: Receiver<Control>,
    mut link: Arc<Link>,
    mut blocked: Feed<Blocked>,
) {
    loop {
        let Some((observer, state)) = weak
            .upgrade()
            .map(|s| (s.options.observer.clone(), s.blocked.clone()))
        else {
            return;
        };
        let watched = watch(&control, &blocked, &state, observer.as_ref());
        // A new link starts unblocked (the broker says again if the alarm holds).
        *state.lock() = None;
        if let Watched::Closing = watched {
            close_link(&link);
            return;
        }
        // The I/O thread has ended: close to learn why.
        let reason = match link.opener.amqp.lock().take() {
            Some(amqp) => match amqp.close() {
                Ok(()) => "closed".to_string(),
                Err(e) => e.to_string(),
            },
            None => "closed".to_string(),
        };
        match weak.upgrade() {
            Some(shared) if set_down(&shared, &reason) => shared.health.lost(),
            _ => return,
        }
        observer.connection(&ConnectionEvent::Lost {
            address: &link.address,
            reason: &reason,
        });
        match reconnect(&weak, &control, link.generation + 1, observer.as_ref()) {
            Some((new, b)) => {
                link = new;
                blocked = b;
            }
            None => return,
        }
    }
}

/// How watching a live link ended.
enum Watched {
    /// The I/O thread ended (the connection dropped).
    Dropped,
    /// [`Connection::close`] was called.
    Closing,
}

/// Watches a live link, reporting the broker's blocked/unblocked notices, until its I/O thread
/// ends or the connection is closed.
fn watch(
    control: &Receiver<Control>,
    blocked: &Feed<Blocked>,
    state: &Mutex<Option<String>>,
    observer: &dyn Observer,
) -> Watched {
    loop {
        let mut select = Select::new();
        let on_blocked = blocked.register(&mut select);
        let on_control = select.recv(control);
        let op = select.select();
        if op.index() == on_control {
            let _ = op.recv(control);
            return Watched::Closing;
        }
        debug_assert_eq!(op.index(), on_blocked);
        match blocked.read(op) {
            Ok(Blocked::Blocked(reason)) => {
                *state.lock() = Some(reason.clone());
                observer.connection(&ConnectionEvent::Blocked { reason: &reason })
            }
            Ok(Blocked::Unblocked) => {
                *state.lock() = None;
                observer.connection(&ConnectionEvent::Unblocked)
            }
            Err(_) => return Watched::Dropped,
        }
    }
}

/// Marks the connection down with `reason`, unless it was closed meanwhile: a closed connection
/// stays closed (the one place this state is written while recovering). False when closed.
fn set_down(shared: &Shared, reason: &str) -> bool {
    let mut state = shared.state.lock();
    if matches!(*state, LinkState::Closed) {
        return false;
    }
    *state = LinkState::Down {
        last_error: reason.to_string(),
    };
    true
}

/// Reconnects with capped exponential backoff until it works (the new link, topology
/// re-declared, and its blocked notices) or the connection is closed or dropped (`None`).
fn reconnect(
    weak: &Weak<Shared>,
    control: &Receiver<Control>,
    generation: u64,
    observer: &dyn Observer,
) -> Option<(Arc<Link>, Feed<Blocked>)> {
    let mut attempt = 0u32;
    loop {
        let shared = weak.upgrade()?;
        match connect_any(&shared.options, &shared.addresses) {
            Ok((amqp, blocked, address)) => {
                let new = Arc::new(Link::new(
                    generation,
                    &address,
                    amqp,
                    shared.options.operation_timeout,
                ));
                redeclare(
                    &shared.topology,
                    shared.options.observer.as_ref(),
                    &new,
                    shared.options.heartbeat,
                );
                let mut state = shared.state.lock();
                if matches!(*state, LinkState::Closed) {
                    drop(state);
                    close_link(&new);
                    return None;
                }
                *state = LinkState::Up(new.clone());
                shared.changed.notify_all();
                drop(state);
                shared.health.reconnected();
                observer.connection(&ConnectionEvent::Connected {
                    address: &new.address,
                    generation,
                });
                return Some((new, blocked));
            }
            Err(e) => {
                attempt += 1;
                let delay = backoff(
                    shared.options.backoff_min,
                    shared.options.backoff_max,
                    attempt,
                );
                let reason = e.to_string();
                // Closed while this attempt was under way: closed it stays.
                if !set_down(&shared, &reason) {
                    return None;
                }
                drop(shared);
                observer.connection(&ConnectionEvent::ReconnectFailed {
                    attempt,
                    reason: &reason,
                    retry_in: delay,
                });
                match control.recv_timeout(delay) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    _ => return None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for attempt in 1..30 {
            let d = backoff(min, max, attempt);
            let full = (min * (1 << (attempt - 1).min(20))).min(max);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
    }
}
