//! The consumer runtime: an owner thread, worker threads, a timer thread for retries waiting in
//! the consumer, outcomes, the family's retry policy, shutdown, and the scoped form.
//!
//! # The path of a message
//!
//! 1. amiquip's I/O thread reads a delivery into the consumer's buffer (at most `prefetch`
//!    unsettled at once: the broker enforces it).
//! 2. A **worker** thread (`worker.rs`) takes it straight from that buffer (each worker holds a
//!    clone of amiquip's receiver for the current subscription, handed over by the owner), runs
//!    the handler (a panic is caught: it is a retry), decides the [`Outcome`], publishes the
//!    copy that outcome needs — to `{queue}.retry.{rung}`, `{queue}.dlq` or `{queue}.parked`,
//!    confirmed and mandatory — and only then sends the settlement, with the delivery, to the
//!    owner. If the copy cannot be published, the original is requeued: a crash or failure in
//!    between duplicates a message, it never loses one. A wait under the broker-wait threshold
//!    goes instead to the **timer** thread (`timer.rs`), which holds it (the delivery stays
//!    unacknowledged), publishes the copy to the queue when it is due, and then sends the
//!    settlement.
//! 3. The **owner** thread (`owner.rs`), which holds the amiquip channel and consumer,
//!    acknowledges (one `multiple` ack for the completed run at the front of the channel's
//!    delivery tags, a single ack for a delivery done behind one still running) or requeues.
//!
//! So a delivery passes from amiquip's thread to one worker and is settled by the owner, with no
//! thread in between on the way to the handler. An ordered handler ([`Handler::ordering`], set by
//! [`ordered`](crate::patterns::ordering::ordered)) is the exception: there the owner reads the buffer,
//! because it decides which delivery may run, and holds a delivery whose key is busy until the
//! key is free before sending it to the workers through a bounded channel; see
//! [`patterns::ordering`](crate::patterns::ordering).
//!
//! A handler with [`Handler::batch_limits`] (the batched
//! [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)) is given batches instead: each worker
//! gathers up to that many deliveries (at most its share of the prefetch, waiting a bounded time
//! for a partial batch), calls [`Handler::handle_batch`] once, then settles each message as in
//! step 2. With [`ConsumerOptions::at_most_once`] the worker has the owner acknowledge the
//! delivery before the handler runs and publishes no copy.
//!
//! A responder's handler ([`Responder`](crate::patterns::request_reply::Responder)) stages its reply on the worker's
//! thread; the worker sends it with the accepted settlement and the owner publishes it on the
//! request's channel just before the acknowledgement (`reply.rs` says why).
//!
//! With [`ConsumerOptions::inline`] (concurrency 1) there are no worker threads: the owner
//! reads each delivery and runs step 2 itself (`worker::take`, the same code a worker runs),
//! then settles it at once — one thread from amiquip's buffer to the acknowledgement, at the
//! price of an owner that is busy while a handler runs (closing waits for it).
//!
//! After a reconnect the owner subscribes again on a new channel with a new generation and hands
//! the workers the new buffer. Deliveries from the old channel are never acknowledged on the new
//! one (amiquip would panic): those not yet started are skipped and outcomes of running ones are
//! dropped with a log line, because the broker redelivers them.
//!
//! amiquip always lets the broker choose the consumer tag, so no tag prefix can be set.

mod outcome;
pub(crate) mod owner;
pub(crate) mod reply;
pub(crate) mod retry;
mod stream_cursor;
mod timer;
pub(crate) mod worker;

pub use outcome::{Handler, HandlerResult, OrderBy, Outcome};
pub use retry::{failure_topology, FailureTopology, RetryPolicy, DEFAULT_BROKER_WAIT_THRESHOLD};
pub(crate) use stream_cursor::{offset_of as stream_offset_of, StreamCursor};
pub(crate) use worker::format_duration;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::codec::Codec;
use crate::connection::Connection;
use crate::envelope::{check_name, HeaderValue, Message};
use crate::error::{Error, Result};
use crate::observe::Observer;
use crate::publish::{Publisher, PublisherOptions};
use crate::stop::StopHandle;

/// Options for a consumer.
#[derive(Clone, Debug)]
pub struct ConsumerOptions {
    prefetch: u16,
    concurrency: usize,
    codec: Option<Arc<dyn Codec>>,
    retry: RetryPolicy,
    declare: bool,
    exclusive: bool,
    arguments: BTreeMap<String, HeaderValue>,
    shutdown_timeout: Duration,
    at_most_once: bool,
    inline: bool,
    /// Set by a [`ConsumerGroup`](crate::patterns::consumer_group::ConsumerGroup) for its members: a suffix of
    /// the thread names (`acemq-consumer-3`) and a tag in log lines.
    label: Option<String>,
    /// Set by a stream reader: where the reader is, for resuming after a reconnect; it also
    /// turns off the attempt check (a stream never retries).
    stream_cursor: Option<Arc<StreamCursor>>,
    /// Set by patterns that decide every message themselves (the scheduler): a message that
    /// arrives past the policy's last attempt still reaches the handler.
    any_attempt: bool,
    /// Set by a responder: its handler stages replies that the owner publishes on the request's
    /// channel before acknowledging it (`reply.rs`); what becomes of them goes to these hooks.
    replies: Option<Arc<dyn reply::ReplyHooks>>,
    /// At most once: how long a worker waits for the owner's word that the ack went out before
    /// it gives the delivery up (`None`: the shutdown timeout, at least 30 s).
    ack_first_wait: Option<Duration>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            prefetch: 32,
            concurrency: 1,
            codec: None,
            retry: RetryPolicy::default(),
            declare: true,
            exclusive: false,
            arguments: BTreeMap::new(),
            shutdown_timeout: Duration::from_secs(30),
            at_most_once: false,
            inline: false,
            label: None,
            stream_cursor: None,
            any_attempt: false,
            replies: None,
            ack_first_wait: None,
        }
    }
}

impl ConsumerOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most unsettled deliveries at once (AMQP `basic.qos`); memory stays bounded by it
    /// whatever the backlog. 1 to 65535. Defaults to 32.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Worker threads running the handler. Defaults to 1 (messages are handled in order).
    pub fn concurrency(mut self, workers: usize) -> Self {
        self.concurrency = workers;
        self
    }

    /// The codec [`Message::payload`] decodes with. Defaults to the connection's.
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }

    /// The retry policy. Defaults to [`RetryPolicy::none`], as in the family: the first failure
    /// goes to `{queue}.dlq`.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Shorthand for `retry(RetryPolicy::no_retry())`: the first failure dead-letters.
    pub fn no_retry(self) -> Self {
        self.retry(RetryPolicy::no_retry())
    }

    /// Declare where the queue's failures go when the consumer is made, as the family's consumers
    /// do: `acemq.dlx` with `{queue}.dlq` and `{queue}.parked` bound to it, and, when the policy
    /// has broker rungs, `acemq.retry`, the rungs and the queue's binding to `acemq.retry`. The
    /// queue itself is never declared here. Defaults to true.
    pub fn declare(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// Ask to be the queue's only consumer. Defaults to false. RabbitMQ 3.10 honours it on
    /// classic queues only: on a quorum queue it is accepted and ignored.
    pub fn exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// A consumer argument, e.g. `x-stream-offset` or `x-priority`.
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into(), value.into());
        self
    }

    /// How long closing waits for running handlers. Defaults to 30 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// At-most-once delivery, chosen on purpose: each delivery is acknowledged when a worker
    /// takes it, **before** the handler runs. A handler that fails (an `Err`, a panic, or any
    /// outcome but accept) then loses the message: no retry copy, no dead letter; it is counted
    /// ([`RunningConsumer::lost`]) and reported to the observer as outcome `lost` (the default
    /// observer logs it at debug). A consumer killed while the handler runs does not get the
    /// message again, and neither does one whose handler is still running when closing gives up
    /// waiting (counted `abandoned`). Deliveries not yet taken by a worker are unacknowledged
    /// and go back to the queue on close, as usual. Each delivery costs one round trip between
    /// the worker and the owner thread before its handler starts (the worker waits for the
    /// broker to have taken the ack). A worker that hears nothing for 30 s (or the shutdown
    /// timeout, if longer) gives the delivery up without running the handler; if the broker
    /// then confirms the ack after all, the message is counted and reported `lost` as well.
    /// Defaults to off: at least once.
    ///
    /// | when the ack goes | guarantee | a failure or crash in the handler |
    /// |---|---|---|
    /// | before the work (this) | at most once | loses the message |
    /// | after the work (default) | at least once | redelivers it (a duplicate is possible) |
    ///
    /// Exactly once is not on offer end to end: no broker acknowledgement can be atomic with
    /// an effect elsewhere. At least once with an idempotent handler
    /// ([`idempotent`](fn@crate::patterns::idempotent::idempotent)) makes duplicates harmless, which is what
    /// most services want; at most once is for data cheaper to lose than to handle twice (a
    /// metrics sample).
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Runs the handler on the consumer's own thread (`acemq-consumer`, the one that holds the
    /// channel and acknowledges; the calling thread with [`Consumer::run`]) instead of on a
    /// worker thread: each delivery is read, handled,
    /// published from (retry copies, a responder's reply) and acknowledged on one thread, with
    /// no hand-off between threads. For quick handlers where latency counts — a
    /// [`Responder`](crate::patterns::request_reply::Responder) answers ~10 % more requests a second with it
    /// on this crate's benchmark machine (README). Defaults to off.
    ///
    /// The price: while a handler runs, nothing else on this consumer moves (a retry held in
    /// the consumer that comes due waits, a stop is seen when the handler returns), and
    /// **closing waits for a running handler to return, however long** — the
    /// [`shutdown_timeout`](Self::shutdown_timeout) does not cut it short and nothing is counted
    /// `abandoned`. A handler that may block for long belongs on a worker (the default).
    ///
    /// Requires concurrency 1 and at-least-once delivery ([`Error::InvalidArgument`] when the
    /// consumer is made otherwise); a handler with ordering ([`ordered`](crate::patterns::ordering::ordered))
    /// or batches (the batched [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)) is refused when
    /// the consumer starts.
    pub fn inline(mut self, inline: bool) -> Self {
        self.inline = inline;
        self
    }

    /// Not for applications (feature `internals`): how long an at-most-once worker waits for the
    /// word that its delivery's ack went out (by default the shutdown timeout, at least 30 s),
    /// so that this crate's tests can make that wait run out without taking 30 s.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn ack_first_wait_for_tests(mut self, wait: Duration) -> Self {
        self.ack_first_wait = Some(wait);
        self
    }

    /// Names this consumer's threads and log lines after `label` (a group member's number).
    pub(crate) fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Makes this a stream reader's consumer, tracking its position in `cursor`.
    pub(crate) fn stream_cursor(mut self, cursor: Arc<StreamCursor>) -> Self {
        self.stream_cursor = Some(cursor);
        self.any_attempt = true;
        self
    }

    /// Hands every message to the handler, whatever its attempt.
    pub(crate) fn any_attempt(mut self) -> Self {
        self.any_attempt = true;
        self
    }

    /// Makes this a responder's consumer: replies its handler stages are published on the
    /// request's channel before the request is acknowledged (see `reply.rs`).
    pub(crate) fn replies(mut self, hooks: Arc<dyn reply::ReplyHooks>) -> Self {
        self.replies = Some(hooks);
        self
    }

    /// Whether the failure topology is declared when the consumer is made.
    pub(crate) fn declares(&self) -> bool {
        self.declare
    }

    pub(crate) fn validate(&self, queue: &str) -> Result<()> {
        check_name("queue", queue, false)?;
        if self.prefetch == 0 {
            return Err(Error::invalid(
                "prefetch must be at least 1: an unlimited prefetch lets amiquip buffer without bound",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        if self.inline && self.concurrency != 1 {
            return Err(Error::invalid(format!(
                "inline handling runs one handler at a time on the consumer's thread: \
                 concurrency must be 1, not {}",
                self.concurrency
            )));
        }
        if self.inline && self.at_most_once {
            return Err(Error::invalid(
                "inline handling cannot be at most once: the ack that goes ahead of the handler \
                 is sent by the thread that would be running it",
            ));
        }
        self.retry.validate()
    }
}

/// What closing a consumer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Handlers that were running when the close began and finished in time (settled).
    pub finished: usize,
    /// Deliveries received whose handler never started (on their way, waiting for a worker, or
    /// a retry held in the consumer), put back on the queue.
    pub requeued: usize,
    /// Handlers started and still running at the deadline (also one on a delivery from before a
    /// reconnect): not settled by us, not waited for; the broker requeues their messages when
    /// the channel closes.
    pub abandoned: usize,
}

/// What the owner and workers of one consumer share.
pub(crate) struct Context {
    pub(crate) queue: String,
    pub(crate) connection: Connection,
    pub(crate) publisher: Publisher,
    pub(crate) policy: RetryPolicy,
    pub(crate) codec: Arc<dyn Codec>,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) prefetch: u16,
    /// Worker threads (a batching worker takes at most its share of the prefetch).
    pub(crate) concurrency: usize,
    pub(crate) exclusive: bool,
    pub(crate) arguments: BTreeMap<String, HeaderValue>,
    pub(crate) shutdown_timeout: Duration,
    /// Copies that could not be published, per message id, for the back-off.
    pub(crate) copy_failures: worker::CopyFailures,
    /// The current subscription's generation; jobs from older ones are skipped.
    pub(crate) generation: AtomicU64,
    /// Set by a [`StopHandle`] (or by the owner when the broker cancels the consumer): the owner
    /// shuts down and workers requeue what they have not started.
    pub(crate) stopping: Arc<AtomicBool>,
    /// Deliveries taken from the subscription's buffer and not yet settled.
    pub(crate) in_flight: InFlight,
    /// The current subscription's buffer (amiquip's receiver), for what is received but not
    /// yet taken.
    pub(crate) buffer: parking_lot::Mutex<Option<Receiver<amiquip::ConsumerMessage>>>,
    pub(crate) max_in_flight: AtomicUsize,
    /// Handlers running now, of any generation.
    pub(crate) running: AtomicUsize,
    /// A group member's number: a suffix of the thread names and a tag in log lines.
    pub(crate) label: Option<String>,
    /// A stream reader's position (see [`ConsumerOptions::stream_cursor`]).
    pub(crate) stream_cursor: Option<Arc<StreamCursor>>,
    /// Every attempt reaches the handler (see [`ConsumerOptions::any_attempt`]).
    pub(crate) any_attempt: bool,
    /// Acknowledge when a worker takes a delivery, before the handler runs.
    pub(crate) at_most_once: bool,
    /// The owner runs the handler itself ([`ConsumerOptions::inline`]).
    pub(crate) inline: bool,
    /// At-most-once deliveries whose handler failed: lost on purpose.
    pub(crate) lost: AtomicU64,
    /// A responder's reply hooks: the owner listens for returned replies.
    pub(crate) replies: Option<Arc<dyn reply::ReplyHooks>>,
    /// At most once: how long a worker waits for the owner's word that the ack went out.
    pub(crate) ack_first_wait: Duration,
}

impl Context {
    pub(crate) fn stop_requested(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// How log lines name this consumer: `"orders"`, or `"orders" (consumer 3)` in a group.
    pub(crate) fn who(&self) -> String {
        match &self.label {
            Some(label) => format!("{:?} (consumer {label})", self.queue),
            None => format!("{:?}", self.queue),
        }
    }

    /// A thread name: `base`, or `base-{label}` in a group.
    pub(crate) fn thread_name(&self, base: &str) -> String {
        match &self.label {
            Some(label) => format!("{base}-{label}"),
            None => base.to_string(),
        }
    }
}

/// Deliveries taken from the current subscription's buffer and not yet settled, counted **for
/// that subscription only**: one word holding the subscription's generation (its low 32 bits)
/// and the count, changed together. A worker that read a delivery of a subscription that has
/// just ended (the reconnect came between its read and its count) does not count it, and a
/// settlement from an ended subscription does not uncount one of the new: neither can leave a
/// count that nothing will ever settle, which would have every later close wait out its
/// timeout.
#[derive(Debug, Default)]
pub(crate) struct InFlight(AtomicU64);

impl InFlight {
    /// The count's bits; the generation's are above them.
    const COUNT: u64 = 0xFFFF_FFFF;

    fn tag(generation: u64) -> u64 {
        (generation & Self::COUNT) << 32
    }

    fn count_of(word: u64) -> usize {
        usize::try_from(word & Self::COUNT).unwrap_or(usize::MAX)
    }

    /// A new subscription, `generation`, starts with none.
    pub(crate) fn begin(&self, generation: u64) {
        self.0.store(Self::tag(generation), Ordering::SeqCst);
    }

    /// A delivery of subscription `generation` was taken: the new count, or `None` (not
    /// counted) when that subscription is no longer the current one.
    pub(crate) fn take(&self, generation: u64) -> Option<usize> {
        let tag = Self::tag(generation);
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w & !Self::COUNT == tag && w & Self::COUNT < Self::COUNT).then_some(w + 1)
            })
            .ok()
            .map(|w| Self::count_of(w + 1))
    }

    /// A delivery of subscription `generation` was settled (nothing changes for another one).
    pub(crate) fn gone(&self, generation: u64) {
        let tag = Self::tag(generation);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w & !Self::COUNT == tag && w & Self::COUNT > 0).then_some(w - 1)
            });
    }

    /// The subscription ended: how many were unsettled (the broker has them back).
    pub(crate) fn clear(&self) -> usize {
        Self::count_of(self.0.fetch_and(!Self::COUNT, Ordering::SeqCst))
    }

    /// How many are in flight now.
    pub(crate) fn count(&self) -> usize {
        Self::count_of(self.0.load(Ordering::SeqCst))
    }
}

/// A delivery handed to a worker: its message, and the delivery itself (emptied of its body and
/// properties), which travels with it to whoever settles it.
pub(crate) struct Job {
    pub(crate) generation: u64,
    pub(crate) tag: u64,
    pub(crate) delivery: amiquip::Delivery,
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
    pub(crate) fn taken(ctx: &Context, generation: u64, mut delivery: amiquip::Delivery) -> Job {
        // Counted before anything else: the owner, closing, waits for it. A delivery of a
        // subscription that has ended meanwhile is not counted (the broker redelivers it, and
        // the worker skips it).
        if let Some(n) = ctx.in_flight.take(generation) {
            // (What is still in amiquip's buffer is not added to the high-water mark: read
            // apart, the two could count one delivery twice.)
            ctx.max_in_flight.fetch_max(n, Ordering::SeqCst);
        }
        let tag = delivery.delivery_tag();
        // A message from outside the family with neither `x-acemq-id` nor `message_id` gets a
        // fresh id as it is read, so that its copies carry an identity from here on.
        let mut message = Message::take_delivery(&mut delivery);
        if let Some(reason) = message.replaced_id {
            ctx.observer.id_replaced(&crate::observe::IdReplaced {
                queue: &ctx.queue,
                id: message.id(),
                reason,
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
    pub(crate) delivery: Option<amiquip::Delivery>,
}

impl Settle {
    pub(crate) fn of(job: &Job, action: SettleAction, started: bool) -> Settle {
        Settle {
            generation: job.generation,
            tag: job.tag,
            action,
            started,
            delivery: None,
        }
    }

    pub(crate) fn with(mut self, delivery: amiquip::Delivery) -> Settle {
        self.delivery = Some(delivery);
        self
    }
}

pub(crate) enum SettleAction {
    Ack,
    /// Publish this reply on the delivery's channel, then acknowledge the delivery (or, with no
    /// delivery, at most once, only publish it).
    Reply(Box<reply::Reply>),
    Requeue,
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
    Signal(Option<Box<amiquip::ConsumerMessage>>),
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

/// A consumer of one queue, not yet running: [`start`](Self::start) it on its own threads, or
/// [`run`](Self::run) it on the caller's thread.
///
/// The scoped form lets the handler borrow local state:
///
/// ```no_run
/// use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let consumer = connection.consumer("orders", ConsumerOptions::new().concurrency(4))?;
/// let stop = consumer.stop_handle();
/// let seen = AtomicUsize::new(0); // borrowed, not 'static
/// let handler = |_: &Message| {
///     seen.fetch_add(1, Ordering::SeqCst);
///     Ok(Outcome::Accept)
/// };
/// std::thread::scope(|s| {
///     let running = s.spawn(|| consumer.run(&handler));
///     // … publish, wait for what you expect …
///     stop.stop();
///     running.join().expect("consumer thread")
/// })?;
/// println!("handled {}", seen.load(Ordering::SeqCst));
/// # Ok(()) }
/// ```
pub struct Consumer {
    ctx: Arc<Context>,
    concurrency: usize,
    stop: StopHandle,
    stop_rx: Receiver<()>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.ctx.queue)
            .field("prefetch", &self.ctx.prefetch)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl Connection {
    /// A consumer of `queue` with these options, not yet running.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] / [`Error::InvalidName`] for bad options; declaring the retry
    /// topology can fail with [`Error::TopologyConflict`].
    pub fn consumer(&self, queue: &str, options: ConsumerOptions) -> Result<Consumer> {
        options.validate(queue)?;
        if options.declare {
            retry::declare_failure_topology(self, queue, &options.retry)?;
        }
        let publisher = self.publisher_with(
            PublisherOptions::new().window(usize::from(options.prefetch).max(16)),
        )?;
        let flag = Arc::new(AtomicBool::new(false));
        let (tx, stop_rx) = crossbeam_channel::bounded(1);
        let ctx = Arc::new(Context {
            queue: queue.to_string(),
            connection: self.clone(),
            publisher,
            policy: options.retry,
            codec: options.codec.unwrap_or_else(|| self.codec()),
            observer: self.observer().clone(),
            prefetch: options.prefetch,
            concurrency: options.concurrency,
            exclusive: options.exclusive,
            arguments: options.arguments,
            shutdown_timeout: options.shutdown_timeout,
            copy_failures: worker::CopyFailures::default(),
            generation: AtomicU64::new(0),
            stopping: flag.clone(),
            in_flight: InFlight::default(),
            buffer: parking_lot::Mutex::new(None),
            max_in_flight: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            label: options.label,
            stream_cursor: options.stream_cursor,
            any_attempt: options.any_attempt,
            at_most_once: options.at_most_once,
            inline: options.inline,
            lost: AtomicU64::new(0),
            replies: options.replies,
            ack_first_wait: options
                .ack_first_wait
                .unwrap_or_else(|| options.shutdown_timeout.max(Duration::from_secs(30))),
        });
        Ok(Consumer {
            ctx,
            concurrency: options.concurrency,
            stop: StopHandle::with_waker(flag, tx),
            stop_rx,
        })
    }

    /// Starts consuming `queue` with default options on threads of its own.
    ///
    /// # Errors
    ///
    /// As [`consumer`](Self::consumer) and [`Consumer::start`].
    pub fn consume<H>(&self, queue: &str, handler: H) -> Result<RunningConsumer>
    where
        H: Handler + Send + Sync + 'static,
    {
        self.consumer(queue, ConsumerOptions::default())?
            .start(handler)
    }
}

impl Consumer {
    /// A handle that stops this consumer from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Deliveries received and not yet settled (taken by a worker, held, or still in amiquip's
    /// buffer).
    pub fn in_flight(&self) -> usize {
        // Taken first, then the buffer: a delivery taken in between is counted at most once.
        let taken = self.ctx.in_flight.count();
        taken + self.ctx.buffer.lock().as_ref().map_or(0, Receiver::len)
    }

    /// The most deliveries ever taken by this consumer and not yet settled at once (running,
    /// held for their ordering key, or waiting in the consumer for a retry; not those still in
    /// amiquip's buffer): never above the prefetch; with [`ConsumerOptions::at_most_once`]
    /// acknowledged deliveries whose handler still runs count too, so up to prefetch +
    /// concurrency.
    pub fn max_in_flight(&self) -> usize {
        self.ctx.max_in_flight.load(Ordering::SeqCst)
    }

    /// With [`ConsumerOptions::at_most_once`], the messages lost: whose handler failed, or
    /// that were acknowledged after their worker had stopped waiting to hear so (not handled);
    /// 0 otherwise.
    pub fn lost(&self) -> u64 {
        self.ctx.lost.load(Ordering::SeqCst)
    }

    /// Consumes on the caller's thread (with `concurrency` scoped worker threads) until stopped
    /// through a [`StopHandle`], then closes as [`RunningConsumer::close`] does. The handler
    /// needs `Sync` only, so it may borrow local state.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the queue does not exist; [`Error::Cancelled`] when the broker
    /// cancels the consumer (the queue was deleted); [`Error::Closed`] when the connection is
    /// closed.
    pub fn run<H: Handler + Sync + ?Sized>(&self, handler: &H) -> Result<CloseReport> {
        check_inline(&self.ctx, handler)?;
        run_on(&self.ctx, self.concurrency, handler, &self.stop_rx, None)
    }

    /// Starts the consumer on threads of its own (`acemq-consumer` and its workers) and returns
    /// once it is subscribed.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the queue does not exist, and other subscription errors.
    pub fn start<H>(self, handler: H) -> Result<RunningConsumer>
    where
        H: Handler + Send + Sync + 'static,
    {
        check_inline(&self.ctx, &handler)?;
        let (started_tx, started_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let ctx = self.ctx.clone();
        let stop_rx = self.stop_rx.clone();
        let concurrency = self.concurrency;
        let thread = std::thread::Builder::new()
            .name(ctx.thread_name("acemq-consumer"))
            .spawn(move || {
                // The report goes out on `done_tx` as soon as the owner is done; this returns
                // after every worker has ended.
                if let Err(e) = run_on(
                    &ctx,
                    concurrency,
                    &handler,
                    &stop_rx,
                    Some((started_tx, done_tx)),
                ) {
                    log::error!("acemq: consumer of {} could not start: {e}", ctx.who());
                }
            })
            .map_err(|e| Error::Io {
                context: "spawning the consumer thread".into(),
                source: e,
            })?;
        match started_rx.recv() {
            Ok(Ok(())) => Ok(RunningConsumer {
                consumer: self,
                thread: Some(thread),
                done: done_rx,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Closed { what: "consumer" })
            }
        }
    }
}

/// Refuses [`ConsumerOptions::inline`] for a handler that needs the owner free while it runs
/// (ordered: the owner holds deliveries behind busy keys) or gathers batches (a worker waits for
/// a batch to fill).
fn check_inline<H: Handler + Sync + ?Sized>(ctx: &Context, handler: &H) -> Result<()> {
    if !ctx.inline {
        return Ok(());
    }
    if handler.ordering().is_some() {
        return Err(Error::invalid(
            "an ordered handler cannot run inline: the consumer's thread decides which delivery \
             may run next while handlers run",
        ));
    }
    if handler.batch_limits().is_some() {
        return Err(Error::invalid(
            "a batching handler cannot run inline: it waits for its batch to fill",
        ));
    }
    Ok(())
}

/// Where a spawned consumer reports its first subscription and its close report.
type Spawned = (Sender<Result<()>>, Sender<Result<CloseReport>>);

/// Runs the owner on this thread and the workers on scoped threads. With `spawned`, the first
/// subscription is reported on its first sender and the close report on its second as soon as
/// the owner is done — before waiting for handlers still running past the deadline.
fn run_on<H: Handler + Sync + ?Sized>(
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
        crossbeam_channel::bounded::<timer::TimerMsg>(usize::from(ctx.prefetch) + 1);
    // Without ordering each worker reads the subscription itself; the owner hands each one the
    // subscription's buffer on `feeds` (one a reconnect).
    let direct = handler.ordering().is_none();
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
                worker::Source::direct(feed_rx)
            } else {
                worker::Source::Owner(jobs_rx.clone())
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
        let result = owner::run(ctx, handler.ordering(), &lines, started);
        drop(run_inline);
        drop(feeds);
        drop(jobs_rx);
        drop(jobs_tx);
        let _ = timer_tx.send_timeout(timer::TimerMsg::Stop, timer::STOP_TIMEOUT);
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

/// A consumer running on its own threads. Dropping it closes it (blocking up to the shutdown
/// timeout).
pub struct RunningConsumer {
    consumer: Consumer,
    thread: Option<JoinHandle<()>>,
    done: Receiver<Result<CloseReport>>,
}

impl std::fmt::Debug for RunningConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningConsumer")
            .field("consumer", &self.consumer)
            .finish()
    }
}

impl RunningConsumer {
    /// A handle that stops this consumer from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.consumer.stop_handle()
    }

    /// Deliveries received and not yet settled (taken by a worker, held, or still in amiquip's
    /// buffer).
    pub fn in_flight(&self) -> usize {
        self.consumer.in_flight()
    }

    /// The most deliveries ever taken by this consumer and not yet settled at once (running,
    /// held for their ordering key, or waiting in the consumer for a retry; not those still in
    /// amiquip's buffer): never above the prefetch; with [`ConsumerOptions::at_most_once`]
    /// acknowledged deliveries whose handler still runs count too, so up to prefetch +
    /// concurrency.
    pub fn max_in_flight(&self) -> usize {
        self.consumer.max_in_flight()
    }

    /// With [`ConsumerOptions::at_most_once`], the messages lost: whose handler failed, or
    /// that were acknowledged after their worker had stopped waiting to hear so (not handled);
    /// 0 otherwise.
    pub fn lost(&self) -> u64 {
        self.consumer.lost()
    }

    /// True once the consumer has ended (stopped, or failed: see [`wait`](Self::wait)).
    pub fn is_finished(&self) -> bool {
        !self.done.is_empty() || self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Cancels the consumer, lets running handlers finish (up to the shutdown timeout) and
    /// settles them, requeues what was received but not started, closes the channel and joins
    /// the threads — except a handler still running at the deadline, which is left to finish on
    /// its own thread (its message goes back to the queue when the channel closes).
    ///
    /// # Errors
    ///
    /// The error that ended the consumer, if it ended on its own ([`Error::Cancelled`], …).
    pub fn close(mut self) -> Result<CloseReport> {
        self.consumer.stop.stop();
        self.finish()
    }

    /// Waits until the consumer ends on its own (stopped through a [`StopHandle`], or failed).
    ///
    /// # Errors
    ///
    /// The error that ended it.
    pub fn wait(mut self) -> Result<CloseReport> {
        self.finish()
    }

    fn finish(&mut self) -> Result<CloseReport> {
        let result = self
            .done
            .recv()
            .unwrap_or_else(|_| Err(Error::Closed { what: "consumer" }));
        if let Some(t) = self.thread.take() {
            if result.as_ref().map(|r| r.abandoned == 0).unwrap_or(true) {
                let _ = t.join();
            }
        }
        result
    }
}

impl Drop for RunningConsumer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.consumer.stop.stop();
            if let Err(e) = self.finish() {
                log::warn!(
                    "acemq: consumer of {} ended with: {e}",
                    self.consumer.ctx.who()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    /// A worker reads a delivery of subscription 1 just as a reconnect begins subscription 2:
    /// it must not count in flight (nothing will ever settle it in generation 2), or every
    /// later close waits out its timeout for it.
    #[test]
    fn a_delivery_taken_for_a_subscription_that_ended_is_not_counted_in_flight() {
        let n = InFlight::default();
        n.begin(1);
        n.begin(2);
        assert_eq!(n.take(1), None);
        assert_eq!(n.count(), 0);
        assert_eq!(n.take(2), Some(1));
    }

    /// A settlement from before the reconnect does not uncount a delivery of the new one.
    #[test]
    fn a_settlement_from_an_ended_subscription_does_not_uncount_a_new_delivery() {
        let n = InFlight::default();
        n.begin(1);
        assert_eq!(n.take(1), Some(1));
        n.begin(2);
        assert_eq!(n.take(2), Some(1));
        n.gone(1);
        assert_eq!(n.count(), 1);
        n.gone(2);
        assert_eq!(n.count(), 0);
        n.gone(2);
        assert_eq!(n.count(), 0, "never below zero");
    }

    /// Clearing at the end of a subscription keeps its generation: a delivery of it read
    /// after the clear and before the next subscription counts until the next begins.
    #[test]
    fn clearing_says_how_many_were_unsettled() {
        let n = InFlight::default();
        n.begin(3);
        n.take(3);
        n.take(3);
        assert_eq!(n.clear(), 2);
        assert_eq!(n.count(), 0);
    }
}
