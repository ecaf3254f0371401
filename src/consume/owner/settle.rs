//! One subscription's settlement state on the owner thread ([`State`]) and applying the workers'
//! and the timer's settlements to it ([`settle`]): acknowledgements, requeues, rejections, a
//! pattern's publishes before their acks (`hook.rs`), keys released, at-most-once acks ahead of handlers.

use std::time::Duration;

use crate::transport::{Channel, ConsumerMessage};
use crossbeam_channel::{Receiver, Sender};

use super::acks::Acks;
use super::ordered::Ordered;
use super::put_back::put_back;
use crate::consume::hook::OnChannel;
use crate::consume::report::CloseReport;
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{Job, Settle, SettleAction};
use crate::consume::worker::at_most_once::acked_unhandled;
use crate::observe::Settlement;

/// One subscription's settlement state.
pub(in crate::consume) struct State<'a> {
    pub(in crate::consume) generation: u64,
    pub(in crate::consume) acks: Acks,
    /// Ordering keys busy, with the deliveries waiting for each.
    pub(in crate::consume) ordered: Ordered<'a>,
    /// Workers that found the subscription ended (its buffer disconnected).
    pub(in crate::consume) ended: usize,
    /// What ended it, when a worker read why (the broker cancelled the consumer, closed the
    /// channel, …).
    pub(in crate::consume) reason: Option<ConsumerMessage>,
}

/// `first` and every settlement already waiting behind it: settled (and acknowledged) as one
/// batch.
pub(in crate::consume) fn with_waiting(first: Settle, settles: &Receiver<Settle>) -> Vec<Settle> {
    let mut batch = vec![first];
    batch.extend(settles.try_iter());
    batch
}

/// The settlements in `batch` of handlers of this `generation` that ran: each, settled while
/// closing, is a handler that finished in time.
pub(in crate::consume) fn finished_in(batch: &[Settle], generation: u64) -> usize {
    batch
        .iter()
        .filter(|s| s.generation == generation && s.started)
        .filter(|s| !matches!(s.action, SettleAction::Signal(_)))
        .count()
}

/// A delivery of subscription `generation` was settled: one fewer in flight. What a batch
/// settled is told once, by [`settled_some`].
pub(in crate::consume) fn gone(ctx: &Context, generation: u64) {
    ctx.in_flight.gone(generation);
}

/// Deliveries were settled (a batch of them, or the ones put back at a stop): the observer hears
/// the count in flight now, and the consumer's health the time — once per batch, not per
/// delivery.
pub(in crate::consume) fn settled_some(ctx: &Context) {
    ctx.observer.in_flight(&crate::observe::InFlight {
        queue: &ctx.queue,
        in_flight: ctx.in_flight.count(),
    });
    ctx.last_settled_ms.store(
        crate::envelope::now_ms(),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The delivery `tag` no longer holds its key (settled, or its handler is done): the next
/// delivery waiting for the key goes to the workers.
pub(in crate::consume) fn release_key(state: &mut State<'_>, tag: u64, jobs: &Sender<Job>) {
    if let Some(next) = state.ordered.release(tag) {
        let _ = jobs.send(next);
    }
}

/// Applies settlements, then acknowledges what is done (see [`Acks`]). The workers' signals of
/// this subscription are recorded in `state` for the caller to act on.
pub(in crate::consume) fn settle(
    ctx: &Context,
    channel: &Channel,
    state: &mut State<'_>,
    jobs: &Sender<Job>,
    batch: Vec<Settle>,
    report: &mut CloseReport,
) -> std::result::Result<(), crate::transport::AmqpError> {
    let generation = state.generation;
    let ran = u64::try_from(finished_in(&batch, generation)).unwrap_or(u64::MAX);
    ctx.handled
        .fetch_add(ran, std::sync::atomic::Ordering::Relaxed);
    // At-most-once handlers waiting for their delivery's ack to reach the broker.
    let mut acked_first = Vec::new();
    // Whether any delivery of this batch was settled (told once, at the end).
    let mut settled = false;
    for s in batch {
        if s.generation != generation {
            if matches!(s.action, SettleAction::Signal(_)) {
                continue;
            }
            log::info!(
                "acemq: dropping the outcome of a delivery on {:?} from before a reconnect; \
                 the broker redelivers it",
                ctx.queue
            );
            ctx.observer.settled(&Settlement {
                queue: &ctx.queue,
                outcome: crate::observe::Decision::Dropped,
                attempt: 0,
                handler_duration: Duration::ZERO,
                message_id: "",
                error: None,
            });
            continue;
        }
        match s.action {
            SettleAction::Ack => {
                release_key(state, s.tag, jobs);
                // Without its delivery it was acknowledged ahead of its handler (at most once).
                if let Some(d) = s.delivery {
                    state.acks.done(d);
                }
                gone(ctx, generation);
                settled = true;
            }
            SettleAction::BeforeAck(work) => {
                // Before the acknowledgement, on the same channel: the broker has routed what it
                // publishes by the time it takes the ack (`hook.rs`). If it cannot go out,
                // neither can the ack: the delivery comes again (and is answered again).
                work.run(OnChannel {
                    channel,
                    observer: &*ctx.observer,
                })?;
                release_key(state, s.tag, jobs);
                if let Some(d) = s.delivery {
                    state.acks.done(d);
                }
                gone(ctx, generation);
                settled = true;
            }
            SettleAction::Requeue => {
                release_key(state, s.tag, jobs);
                if !s.started {
                    report.requeued += 1;
                }
                if let Some(d) = s.delivery {
                    d.nack(channel, true)?;
                    state.acks.settled(s.tag);
                }
                gone(ctx, generation);
                settled = true;
            }
            SettleAction::PutBack(message) => {
                release_key(state, s.tag, jobs);
                if !s.started {
                    report.requeued += 1;
                }
                if let Some(d) = s.delivery {
                    put_back(ctx, channel, &mut state.acks, d, &message)?;
                }
                gone(ctx, generation);
                settled = true;
            }
            SettleAction::Reject => {
                release_key(state, s.tag, jobs);
                if let Some(d) = s.delivery {
                    d.nack(channel, false)?;
                    state.acks.settled(s.tag);
                }
                gone(ctx, generation);
                settled = true;
            }
            SettleAction::Released => release_key(state, s.tag, jobs),
            SettleAction::Again(message) => {
                if let Some(delivery) = s.delivery {
                    let hold = state.ordered.holds_retries();
                    let _ = jobs.send(Job {
                        generation,
                        tag: s.tag,
                        delivery,
                        message: *message,
                        keyed: true,
                        hold,
                    });
                }
            }
            SettleAction::AckFirst(question) => match s.delivery {
                Some(d) => {
                    if let Err(e) = d.ack(channel) {
                        question.answer(false);
                        return Err(e);
                    }
                    state.acks.settled(s.tag);
                    acked_first.push((s.tag, question));
                }
                None => {
                    question.answer(false);
                }
            },
            SettleAction::Signal(None) => state.ended += 1,
            SettleAction::Signal(Some(reason)) => {
                state.reason.get_or_insert(*reason);
            }
        }
    }
    if !acked_first.is_empty() {
        // AMQP never answers an ack, and amiquip only queues it for the socket: a handler let
        // go now could run while the ack is still on its way, and a cut then has the broker
        // deliver the message again — a second run at most once forbids. A synchronous method
        // on the same channel is answered only after the broker has processed everything sent
        // before it, the acks included; re-stating the prefetch changes nothing.
        let processed = channel.qos(0, ctx.prefetch(), false);
        for (tag, question) in acked_first {
            if question.answer(processed.is_ok()) {
                continue;
            }
            // Its worker gave up waiting for this answer and did not run the handler.
            if processed.is_ok() {
                acked_unhandled(ctx, &question);
                release_key(state, tag, jobs);
                gone(ctx, generation);
                settled = true;
            } else {
                log::warn!(
                    "acemq: message {} from {}: its acknowledgement ahead of the handler may \
                     have reached the broker before the channel failed; its handler did not \
                     run",
                    question.id,
                    ctx.who()
                );
            }
        }
        processed?;
    }
    if settled {
        settled_some(ctx);
    }
    state.acks.flush(channel)
}
