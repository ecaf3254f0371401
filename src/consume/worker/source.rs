//! Where a worker takes its deliveries ([`Source`]): straight from amiquip's consumer buffer
//! (the subscription's receiver, handed over per subscription as a [`Feed`]), or from the owner
//! for an ordered handler.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::transport::{ConsumerMessage, Deliveries};
use crossbeam_channel::{select, Receiver, Select, Sender};

use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{Job, Settle, SettleAction};

/// One subscription's buffer of deliveries, handed by the owner to each worker that reads it
/// itself (a clone of amiquip's receiver; amiquip's consumer itself stays on the owner thread).
pub(crate) struct Feed {
    pub(crate) generation: u64,
    pub(crate) deliveries: Deliveries,
}

/// Where a worker takes its deliveries.
pub(crate) enum Source {
    /// From the owner, which decides what may run (an ordered handler).
    Owner(Receiver<Job>),
    /// Straight from the subscription's buffer: no thread between amiquip's I/O thread and the
    /// handler. `current` is the subscription being read; a new one arrives on `feeds` after a
    /// reconnect, and `feeds` closes when the consumer ends.
    Direct {
        feeds: Receiver<Feed>,
        current: Option<Feed>,
    },
}

/// What [`Source::next`] found. (A job is moved out once per delivery; boxing it would cost an
/// allocation per delivery instead.)
#[allow(clippy::large_enum_variant)]
pub(in crate::consume) enum Next {
    Job(Job),
    /// The deadline passed.
    Timeout,
    /// The consumer is ending.
    End,
}

impl Source {
    pub(crate) fn direct(feeds: Receiver<Feed>) -> Source {
        Source::Direct {
            feeds,
            current: None,
        }
    }

    /// The next delivery, waiting until `timeout` fires (`never()`: for ever; one `at(…)` per
    /// batch being gathered, not one per delivery). Reading the
    /// subscription itself, a worker passes anything else it reads there on to the owner as a
    /// [`SettleAction::Signal`], and `None` once the subscription has ended; a delivery from a
    /// subscription that is gone is skipped (the broker redelivers it).
    pub(in crate::consume) fn next(
        &mut self,
        ctx: &Context,
        settle: &Sender<Settle>,
        timeout: &Receiver<Instant>,
    ) -> Next {
        let (feeds, current) = match self {
            Source::Owner(jobs) => {
                return select! {
                    recv(jobs) -> job => job.map_or(Next::End, Next::Job),
                    recv(timeout) -> _ => Next::Timeout,
                };
            }
            Source::Direct { feeds, current } => (feeds, current),
        };
        loop {
            let Some(feed) = current.as_ref() else {
                select! {
                    recv(feeds) -> feed => match feed {
                        Ok(feed) => *current = Some(feed),
                        Err(_) => return Next::End,
                    },
                    recv(timeout) -> _ => return Next::Timeout,
                }
                continue;
            };
            let generation = feed.generation;
            let mut select = Select::new();
            let on_delivery = feed.deliveries.register(&mut select);
            let on_feed = select.recv(feeds);
            select.recv(timeout);
            let op = select.select();
            let read = match op.index() {
                i if i == on_delivery => feed.deliveries.read(op),
                i if i == on_feed => match op.recv(feeds) {
                    Ok(feed) => {
                        *current = Some(feed);
                        continue;
                    }
                    Err(_) => return Next::End,
                },
                _ => {
                    let _ = op.recv(timeout);
                    return Next::Timeout;
                }
            };
            match read {
                Ok(ConsumerMessage::Delivery(d)) => {
                    if generation != ctx.generation.load(Ordering::SeqCst) {
                        continue;
                    }
                    return Next::Job(Job::taken(ctx, generation, d));
                }
                Ok(other) => {
                    let _ = settle.send(signal(generation, Some(Box::new(other))));
                }
                Err(_) => {
                    // Ended (cancelled, or the channel is gone): wait for the next one.
                    *current = None;
                    let _ = settle.send(signal(generation, None));
                }
            }
        }
    }
}

fn signal(generation: u64, what: Option<Box<ConsumerMessage>>) -> Settle {
    Settle {
        generation,
        tag: 0,
        action: SettleAction::Signal(what),
        started: false,
        delivery: None,
    }
}
