//! The timer thread (`acemq-retry-timer`): holds the retries whose wait is spent in the consumer
//! (shorter than the broker-wait threshold) so that no worker thread sleeps.
//!
//! A worker hands over a [`Delayed`]: the copy to publish and the tag of the original, which
//! stays **unacknowledged** on the owner's channel meanwhile, as the family's consumers hold it.
//! When it is due the timer publishes the copy to the queue itself (confirmed, mandatory) and
//! tells the owner to acknowledge the original. A copy that could not be published is treated
//! as a worker treats its own failed copies: never requeued at once (a lasting refusal would
//! spin: redelivered, handled, held, refused, …). A failure that can never clear as the copy is
//! (a fault of the message, not retriable: [`Error::is_message_fault`],
//! [`Error::is_retriable`]) sends it to `.dlq` with the reason, then acknowledges the original;
//! any other (a nack, a lost connection) keeps the original held for the worker's copy-failure
//! pause (1 s doubling per failure of that message, at most 30 s), reports `copy_failed` and
//! then requeues it. What is held is bounded by the prefetch (each entry is an unsettled
//! delivery).
//!
//! A held retry of an ordered message with `hold_on_retry` (`again`) is not published: when due
//! it goes back to the owner, which runs the handler again on the same delivery.
//!
//! Entries from before a reconnect are dropped when due: their deliveries are the broker's
//! again. On close the owner sends [`TimerMsg::Stop`]: every entry still waiting is requeued
//! unchanged (same attempt), as a family consumer's held delivery is when its channel closes,
//! and so is every entry a worker hands over after the stop, until the workers are gone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::copies::{dead_letter_held, publish};
use super::copy_failures::copy_failure_pause;
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::{Delayed, Settle, SettleAction, TimerMsg};
use crate::envelope::Message;
use crate::error::Error;
use crate::observe::Settlement;

/// Heap entry ordered by due time, then arrival.
struct Entry {
    due: Instant,
    seq: u64,
    delayed: Box<Delayed>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// Runs until [`TimerMsg::Stop`] or until every sender is gone.
pub(crate) fn run(ctx: &Context, input: Receiver<TimerMsg>, settle: Sender<Settle>) {
    let mut heap: BinaryHeap<Reverse<Entry>> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let msg = match heap.peek() {
            Some(Reverse(first)) => {
                let wait = first.due.saturating_duration_since(Instant::now());
                if wait.is_zero() {
                    Err(RecvTimeoutError::Timeout)
                } else {
                    input.recv_timeout(wait)
                }
            }
            None => input.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match msg {
            Ok(TimerMsg::Delay(delayed)) => {
                seq += 1;
                heap.push(Reverse(Entry {
                    due: delayed.due,
                    seq,
                    delayed,
                }));
            }
            Ok(TimerMsg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                for Reverse(e) in heap.drain() {
                    requeue(ctx, &settle, *e.delayed);
                }
                // A worker may still hand over a retry it decided while the consumer closed
                // (sent after the stop): put each back at once, until every worker is gone.
                // (Ending here would drop what is already queued behind the stop, delivery
                // and all: the owner would wait for it until its shutdown deadline.)
                for msg in input.iter() {
                    if let TimerMsg::Delay(d) = msg {
                        requeue(ctx, &settle, *d);
                    }
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                let mut later = Vec::new();
                while heap.peek().is_some_and(|Reverse(e)| e.due <= now) {
                    if let Some(Reverse(e)) = heap.pop() {
                        later.extend(fire(ctx, &settle, e.delayed));
                    }
                }
                // Originals whose copy failed, held again for their pause (after the loop: a
                // pause is never zero, but a due one must not be fired twice in one pass).
                for delayed in later {
                    seq += 1;
                    heap.push(Reverse(Entry {
                        due: delayed.due,
                        seq,
                        delayed,
                    }));
                }
            }
        }
    }
}

/// Publishes a due copy, then settles the original; or, when the copy could not be published
/// and may be later, returns the original to hold again for its pause (see the module docs).
fn fire(ctx: &Context, settle: &Sender<Settle>, mut d: Box<Delayed>) -> Option<Box<Delayed>> {
    if d.generation != ctx.generation.load(Ordering::SeqCst) {
        log::debug!(
            "acemq: dropping a held delivery (tag {}) from before a reconnect (it is \
             redelivered)",
            d.tag
        );
        return None;
    }
    let action = match d.copy.take() {
        None => SettleAction::Requeue,
        Some(copy) if d.again => SettleAction::Again(Box::new(copy)),
        Some(copy) => {
            // Kept for `.dlq` should the publish fail (published, the copy is the publisher's).
            let kept = copy.clone();
            match publish(ctx, &ctx.queue, copy) {
                Ok(()) => {
                    if !d.put_back {
                        ctx.copy_failures.succeeded(kept.id());
                    }
                    SettleAction::Ack
                }
                Err(e) => match copy_failed(ctx, &mut d, kept, &e) {
                    Some(action) => action,
                    None => return Some(d),
                },
            }
        }
    };
    let _ = settle.send(Settle {
        generation: d.generation,
        tag: d.tag,
        action,
        started: true,
        delivery: Some(d.delivery),
    });
    None
}

/// A held copy whose publish failed with `e`: the action for its original when the copy went to
/// `.dlq` instead (a failure that can never clear as it is), or `None` with `d` set to hold the
/// original for the copy-failure pause and then requeue it. Either way logged and reported to
/// the observer: `copy_failed`, or `dead_letter` once its copy is in `.dlq`.
fn copy_failed(
    ctx: &Context,
    d: &mut Delayed,
    mut held: Message,
    e: &Error,
) -> Option<SettleAction> {
    let what = if d.put_back {
        "copy of itself"
    } else if held.envelope.attempt > d.attempt {
        "retry"
    } else {
        "in-progress copy"
    };
    let failures = ctx.copy_failures.failed(held.id());
    let text = format!(
        "could not publish its {what} (attempt {}) back to {:?} after its wait in the consumer \
         (failure {failures} here): {e}",
        held.envelope.attempt, ctx.queue
    );
    let action = if never_clears(e) {
        // It can never be published as it is (the engine refused it, the queue is gone): to
        // `.dlq`, at the attempt the handler saw, with the reason.
        held.envelope.attempt = d.attempt;
        match dead_letter_held(ctx, &held, text.clone()) {
            Ok(action) => {
                log::error!(
                    "acemq: message {} from {:?} {text}; dead-lettered instead",
                    held.id(),
                    ctx.queue
                );
                Some(action)
            }
            Err(dlq) => {
                log::error!(
                    "acemq: message {} from {:?} {text}; nor could it be dead-lettered: {dlq}",
                    held.id(),
                    ctx.queue
                );
                None
            }
        }
    } else {
        None
    };
    // Dead-lettered, it is reported as the worker reports the consumer's own dead-letter
    // (`dead_letter`).
    let (outcome, error) = match &action {
        Some(SettleAction::Ack) => (crate::observe::Decision::DeadLetter, text),
        Some(_) => (crate::observe::Decision::CopyFailed, text),
        None => {
            let pause = copy_failure_pause(failures);
            log::error!(
                "acemq: message {} from {:?} {text}; the original goes back to the queue in \
                 {pause:?}",
                held.id(),
                ctx.queue
            );
            d.due = Instant::now() + pause;
            if what == "retry" {
                // It comes back as it was, the same attempt: the family's retry `requeued`.
                super::copies::retried(
                    ctx,
                    &held,
                    d.attempt,
                    pause,
                    crate::observe::RetryWhere::Requeued,
                );
            }
            (crate::observe::Decision::CopyFailed, text)
        }
    };
    ctx.observer.settled(&Settlement {
        queue: &ctx.queue,
        outcome,
        attempt: d.attempt,
        handler_duration: Duration::ZERO,
        message_id: held.id(),
        error: Some(&error),
    });
    if action.is_none() {
        // Held again: when the pause is over a fresh copy of the original itself goes back to
        // the queue (never a requeue, which the broker would count: `put_back.rs`).
        held.envelope.attempt = d.attempt;
        d.copy = Some(held);
        d.put_back = true;
    }
    action
}

/// A publish failure that trying again later cannot cure as the copy is: a fault of the message
/// (the engine refused it before sending, or the broker could not route it) that is not
/// retriable. A nack (a full queue, say) is retriable: waited out, never dead-lettered.
fn never_clears(e: &Error) -> bool {
    e.is_message_fault() && !e.is_retriable()
}

fn requeue(ctx: &Context, settle: &Sender<Settle>, d: Delayed) {
    if d.generation != ctx.generation.load(Ordering::SeqCst) {
        return;
    }
    // A held retry failed, and goes back as such; an original held after its copy failed is
    // put back without a counted return when it can be (`put_back.rs`).
    let action = match d.copy {
        Some(copy) if d.put_back => SettleAction::PutBack(Box::new(copy)),
        _ => SettleAction::Requeue,
    };
    let _ = settle.send(Settle {
        generation: d.generation,
        tag: d.tag,
        action,
        started: false,
        delivery: Some(d.delivery),
    });
}

/// How long a stop waits for room in the timer's input.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::never_clears;
    use crate::error::Error;
    use std::time::Duration;

    /// Which failures of a held copy dead-letter it (the rest back off and requeue it).
    #[test]
    fn a_held_copy_is_dead_lettered_only_for_a_failure_that_never_clears() {
        let unroutable = Error::Unroutable {
            exchange: String::new(),
            routing_key: "orders".into(),
            message_id: "m".into(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        };
        let too_large = Error::FrameTooLarge {
            message_id: "m".into(),
            size: 200_000,
            limit: 131_072,
        };
        let invalid = Error::InvalidHeader {
            name: "x".into(),
            reason: "no".into(),
        };
        for e in [unroutable, too_large, invalid] {
            assert!(never_clears(&e), "{e:?}");
        }
        let nacked = Error::Nacked {
            message_id: "m".into(),
        };
        let lost = Error::ConnectionLost {
            context: "waiting for a publish confirm".into(),
        };
        let timeout = Error::Timeout {
            what: "a confirm".into(),
            after: Duration::from_secs(30),
        };
        let blocked = Error::Blocked {
            reason: "low on memory".into(),
            after: Duration::from_secs(30),
        };
        let closed = Error::Closed { what: "publisher" };
        for e in [nacked, lost, timeout, blocked, closed] {
            assert!(!never_clears(&e), "{e:?}");
        }
    }
}
