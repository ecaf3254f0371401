//! The messages between the threads of one consumer: a delivery handed to a worker ([`Job`],
//! [`Parked`] while its handler runs), a worker's or the timer's word to the owner ([`Settle`], [`SettleAction`], with the
//! at-most-once question [`AckAhead`]), and what the timer thread is handed ([`TimerMsg`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::context::Context;
use crate::consume::hook::BeforeAck;
use crate::envelope::Message;

/// A delivery handed to a worker: its message, and the delivery itself (emptied of its body and
/// properties), which travels with it to whoever settles it.
pub(crate) struct Job {
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    pub(crate) delivery: crate::transport::Delivery,
    pub(crate) message: Message,
    /// It has an ordering key: the owner holds later messages with the key until it settles
    /// (or, without `hold`, until its handler is done).
    pub(crate) keyed: bool,
    /// A retry keeps the key: waited out in the consumer on the same delivery.
    pub(crate) hold: bool,
}

impl Job {
    /// A delivery just taken from the subscription's buffer (by a worker, or by the owner for
    /// an ordered handler), counted in flight, as a job with no ordering key.
    pub(crate) fn taken(
        ctx: &Context,
        generation: u64,
        mut delivery: crate::transport::Delivery,
    ) -> Job {
        // Counted before anything else: the owner, closing, waits for it. A delivery of a
        // subscription that has ended meanwhile is not counted (the broker redelivers it, and
        // the worker skips it).
        let in_flight = ctx.in_flight.take(generation);
        if let Some(n) = in_flight {
            // (What is still in amiquip's buffer is not added to the high-water mark: read
            // apart, the two could count one delivery twice.)
            ctx.max_in_flight.fetch_max(n, Ordering::SeqCst);
        }
        let tag = delivery.delivery_tag();
        // A message from outside the family with neither `x-acemq-id` nor `message_id` gets a
        // fresh id as it is read, so that its copies carry an identity from here on.
        let mut message = delivery.take_message();
        if let Some(reason) = message.replaced_id {
            ctx.observer.id_replaced(&crate::observe::IdReplaced {
                queue: &ctx.queue,
                id: message.id(),
                reason,
            });
        }
        if let Some(in_flight) = in_flight {
            // The family samples the attempt on the way in (`acemq.consume.attempts`).
            ctx.observer.received(&crate::observe::Received {
                queue: &ctx.queue,
                message_id: message.id(),
                attempt: message.envelope.attempt,
                in_flight,
            });
        }
        message.codec = Some(ctx.codec.clone());
        Job {
            generation,
            tag,
            delivery,
            message,
            keyed: false,
            hold: false,
        }
    }
}

/// A job whose handler is running: all of it but the delivery, which is held in the consumer's
/// [`RunningDeliveries`](super::abandon::RunningDeliveries) meanwhile, so that a consumer closing
/// past its shutdown deadline can give it back itself (`abandon.rs`).
pub(crate) struct Parked {
    generation: u64,
    tag: u64,
    pub(crate) message: Message,
    keyed: bool,
    hold: bool,
}

impl Job {
    /// Parks the job's delivery in `ctx`'s running deliveries while its handler runs.
    pub(crate) fn park(self, ctx: &Context) -> Parked {
        let Job {
            generation,
            tag,
            delivery,
            message,
            keyed,
            hold,
        } = self;
        ctx.running_deliveries
            .hold(generation, tag, delivery, &message);
        Parked {
            generation,
            tag,
            message,
            keyed,
            hold,
        }
    }
}

impl Parked {
    /// The handler ended: the job again, or `None` (logged) when the closing consumer gave the
    /// delivery back meanwhile — then the handler's result must be dropped.
    pub(crate) fn unpark(self, ctx: &Context) -> Option<Job> {
        let Some(delivery) = ctx.running_deliveries.release(self.generation, self.tag) else {
            log::warn!(
                "acemq: the handler of message {} on {} ended after the consumer's shutdown \
                 deadline; the message was given back, and this result is dropped",
                self.message.id(),
                ctx.who()
            );
            return None;
        };
        Some(Job {
            generation: self.generation,
            tag: self.tag,
            delivery,
            message: self.message,
            keyed: self.keyed,
            hold: self.hold,
        })
    }
}

/// A worker's (or the timer's) word to the owner.
pub(crate) struct Settle {
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    pub(crate) action: SettleAction,
    /// False when the handler never ran (closing).
    pub(crate) started: bool,
    /// The delivery to acknowledge or reject (`None` for [`SettleAction::Released`] and
    /// [`SettleAction::Signal`], and for the final word on an at-most-once delivery, which was
    /// acknowledged ahead of its handler).
    pub(crate) delivery: Option<crate::transport::Delivery>,
}

pub(crate) enum SettleAction {
    Ack,
    /// Run this (a pattern's publish, `hook.rs`) on the delivery's channel, then acknowledge the
    /// delivery (or, with no delivery, at most once, only run it).
    BeforeAck(Box<dyn BeforeAck>),
    Requeue,
    /// Give it back to the queue without the broker counting a second return of it (the
    /// message as received: `put_back.rs`): a delivery the consumer received but never started.
    PutBack(Box<Message>),
    /// Reject it without requeueing (`basic.nack`, requeue false): to the queue's own
    /// dead-lettering. For a message no copy of which can be sent (its header frame cannot fit
    /// the frame limit, even trimmed).
    Reject,
    /// The handler of a keyed message is done but its delivery stays held (a retry waiting in
    /// the consumer): free its key, settle nothing.
    Released,
    /// Run the handler again on the same delivery (a held retry of an ordered message).
    Again(Box<Message>),
    /// At most once: acknowledge it now, before the handler runs, and answer whether the ack
    /// went out (false: the delivery is the broker's again, do not run it).
    AckFirst(AckAhead),
    /// A worker reading the subscription itself read something other than a delivery (the
    /// broker cancelled the consumer, closed the channel, …) or, with `None`, found it ended:
    /// the owner decides what follows.
    Signal(Option<Box<crate::transport::ConsumerMessage>>),
}

/// At most once: a worker's question to the owner — did this delivery's ack go out? — and the
/// answer, shared by the two. The worker waits for the answer up to a deadline and then gives
/// up without running the handler; the owner, answering, learns whether the worker still
/// waited. So a delivery acknowledged after its worker gave up (the broker confirmed late) is
/// known to the owner, which counts it lost and settled — acknowledged, never handled —
/// instead of it vanishing uncounted and staying in flight. Dropped unanswered (the owner
/// discarded it, or is gone), it answers "not acknowledged".
pub(crate) struct AckAhead {
    shared: Arc<AckShared>,
    /// The message's id and attempt, for the owner's report of a loss.
    pub(crate) id: String,
    pub(crate) attempt: u32,
}

#[derive(Default)]
struct AckShared {
    state: parking_lot::Mutex<AckState>,
    answered: parking_lot::Condvar,
}

#[derive(Clone, Copy, Default, PartialEq)]
enum AckState {
    #[default]
    Waiting,
    Answered(bool),
    GaveUp,
}

impl AckAhead {
    /// The question about `message`, and the handle its worker waits on.
    pub(crate) fn ask(message: &Message) -> (AckAhead, AckWait) {
        let shared = Arc::new(AckShared::default());
        let question = AckAhead {
            shared: shared.clone(),
            id: message.id().to_string(),
            attempt: message.envelope.attempt,
        };
        (question, AckWait(shared))
    }

    /// The owner's answer: `acked` when the ack went out and the broker has processed it.
    /// True when the worker was still waiting (it runs the handler, or not, as told); false
    /// when it had given up.
    pub(crate) fn answer(&self, acked: bool) -> bool {
        let mut state = self.shared.state.lock();
        match *state {
            AckState::Waiting => {
                *state = AckState::Answered(acked);
                self.shared.answered.notify_all();
                true
            }
            AckState::Answered(_) => true,
            AckState::GaveUp => false,
        }
    }
}

impl Drop for AckAhead {
    fn drop(&mut self) {
        self.answer(false);
    }
}

/// The worker's side of an [`AckAhead`].
pub(crate) struct AckWait(Arc<AckShared>);

impl AckWait {
    /// Waits up to `timeout` for the answer: whether the ack went out, or `None` when no answer
    /// came in time (the worker gives up; the owner learns of it when it answers).
    pub(crate) fn wait(&self, timeout: Duration) -> Option<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut state = self.0.state.lock();
        loop {
            match *state {
                AckState::Answered(acked) => return Some(acked),
                AckState::GaveUp => return None,
                AckState::Waiting => {}
            }
            if self.0.answered.wait_until(&mut state, deadline).timed_out() {
                if let AckState::Answered(acked) = *state {
                    return Some(acked);
                }
                *state = AckState::GaveUp;
                return None;
            }
        }
    }
}

/// A retry waiting in the consumer, or an original waiting to be put back.
pub(crate) struct Delayed {
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    /// The original, unacknowledged meanwhile.
    pub(crate) delivery: crate::transport::Delivery,
    pub(crate) due: Instant,
    /// The original's attempt (a retry copy carries the next one).
    pub(crate) attempt: u32,
    /// The copy to publish to the queue when due; `None`: requeue the original.
    pub(crate) copy: Option<Message>,
    /// `copy` is a fresh copy of the original itself, put back after a copy of it could not be
    /// published and its pause is over (so the broker never counts the return: `put_back.rs`);
    /// its publish is not a success of the copy that failed.
    pub(crate) put_back: bool,
    /// Hand `copy` back to the owner to run the handler again on the same delivery (a held
    /// retry of an ordered message) instead of publishing it.
    pub(crate) again: bool,
}

/// What the timer thread receives.
pub(crate) enum TimerMsg {
    /// Hold this until it is due.
    Delay(Box<Delayed>),
    /// The consumer is closing: requeue everything held, then end.
    Stop,
}
