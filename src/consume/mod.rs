//! The consumer runtime: an owner thread, worker threads, a timer thread for retries waiting in
//! the consumer, outcomes, the family's retry policy, shutdown, and the scoped form.
//!
//! # The path of a message
//!
//! 1. amiquip's I/O thread reads a delivery into the consumer's buffer (at most `prefetch`
//!    unsettled at once: the broker enforces it).
//! 2. A **worker** thread (`worker/`) takes it straight from that buffer (each worker holds a
//!    clone of amiquip's receiver for the current subscription, handed over by the owner), runs
//!    the handler (a panic is caught: it is a retry), decides the [`Outcome`], publishes the
//!    copy that outcome needs — to `{queue}.retry.{rung}`, `{queue}.dlq` or `{queue}.parked`,
//!    confirmed and mandatory — and only then sends the settlement, with the delivery, to the
//!    owner. If the copy cannot be published, the original is requeued: a crash or failure in
//!    between duplicates a message, it never loses one. A wait under the broker-wait threshold
//!    goes instead to the **timer** thread (`ladder/timer.rs`), which holds it (the delivery stays
//!    unacknowledged), publishes the copy to the queue when it is due, and then sends the
//!    settlement.
//! 3. The **owner** thread (`owner/`), which holds the amiquip channel and consumer,
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
//! A pattern that takes part in each delivery's life (a responder's reply on the request's
//! channel, a stream reader's position, a group member's thread names) does it through one
//! crate-private [`DeliveryHook`] in the consumer's options, which the engine calls at fixed
//! points (`hook.rs` lists them); the pattern's code stays in its folder. The hook's
//! [`BeforeAck`] is what the owner runs on the delivery's channel just before the
//! acknowledgement (`hook.rs` says why).
//!
//! With [`ConsumerOptions::inline`] (concurrency 1) there are no worker threads: the owner
//! reads each delivery and runs step 2 itself (`worker/mod.rs` `take`, the same code a worker runs),
//! then settles it at once — one thread from amiquip's buffer to the acknowledgement, at the
//! price of an owner that is busy while a handler runs (closing waits for it).
//!
//! After a reconnect the owner subscribes again on a new channel with a new generation and hands
//! the workers the new buffer. Deliveries from the old channel are never acknowledged on the new
//! one (amiquip would panic): those not yet started are skipped and outcomes of running ones are
//! dropped with a log line, because the broker redelivers them.
//!
//! amiquip always lets the broker choose the consumer tag, so no tag prefix can be set.
//!
//! # Files
//!
//! Grouped by job: what a user or a pattern sees at the top, then one folder per thread's work.
//!
//! | file or folder | its job |
//! |---|---|
//! | `options.rs` | [`ConsumerOptions`] and their validation |
//! | `consumer.rs` | [`Consumer`]: made by `Connection::consumer` (validated, no threads), [`Consumer::run`] on the caller's thread |
//! | `running.rs` | [`Consumer::start`], `Connection::consume`, [`RunningConsumer`] (close, wait, drop) |
//! | `report.rs` | [`CloseReport`] |
//! | `health.rs` | a running consumer's part of the connection's health |
//! | `outcome.rs` | outcomes and verdicts |
//! | `hook.rs` | [`DeliveryHook`]: how a pattern takes part in a delivery's life; [`BeforeAck`], run on the delivery's channel before its ack |
//! | `flow/` | a running consumer's life: `mod.rs` (flow control: [`RunningConsumer::pause`], `resume`, `scale_to`, `set_prefetch`, `drain` — each ends the subscription as a close does and keeps the consumer), `control.rs` (what flow control sends the consumer's thread, `Control`; how a subscription's life ends, `Ended`), `lifecycle.rs` (the consumer thread's loop of subscriptions: a stop or failure ends it, a pause waits for a resume, a scale subscribes again with the new numbers) |
//! | `threads/` | the threads of one subscription and what they share: `mod.rs` (`run_on`: the owner on this thread, the workers and the timer on scoped threads, the channels between them), `context.rs` (`Context`, `InFlight`), `protocol.rs` (the messages between the threads: `Job` — `Parked` while its handler runs —, `Settle`/`SettleAction`, `AckAhead`, `Delayed`/`TimerMsg`), `abandon.rs` (the deliveries of running handlers, given back by a close past its deadline) |
//! | `owner/` | the owner thread, which alone uses the transport's channel: `mod.rs` (its loop: subscribing again after a reconnect, serving one subscription, shutting down), `subscribe.rs` (a subscription's start and end: link, channel, `basic.consume`, `cancel_and_drain`), `settle.rs` (a subscription's settlement state, `settle`), `acks.rs` (`Acks::flush`: which tags are settled, the acknowledgements), `ordered.rs` (per-key dispatch: deliveries held behind a busy key), `put_back.rs` (giving back without spending RabbitMQ 4.x's delivery limit), `limit_warning.rs` (a quorum queue with no dead-letter target on 4.x) |
//! | `worker/` | a worker thread's work: `mod.rs` (the loop, `run`, and one delivery's step, `take`, also run inline by the owner), `source.rs` (where a worker reads, `Source::next`: the subscription's buffer or the owner), `step.rs` (a delivery's pieces: admitted, judged, finished — copy, then settlement —, its trace and interceptors), `batches.rs` (the batched loop, [`Handler::batch_limits`]), `at_most_once.rs` (the ack ahead of the handler, a late ack's loss) |
//! | `ladder/` | the retry ladder in one room: `policy.rs` (the family's retry policy and topology), `plan.rs` (the whole decision — what a verdict becomes, typed — from the policy, the attempt, the age and the verdict alone, a test per branch), `copies.rs` (a plan carried out: retry, dead-letter, park, trimmed copies, published before the settlement), `copy_failures.rs` (the back-off of an original whose copy failed), `timer.rs` (the timer thread: retries held in the consumer, `fire`) |

mod consumer;
mod flow;
mod health;
mod hook;
mod ladder;
mod options;
mod outcome;
mod owner;
mod report;
mod running;
mod threads;
mod worker;

pub use consumer::Consumer;
pub(crate) use hook::{BeforeAck, DeliveryHook, OnChannel};
// The engine's pieces the patterns that work beside a consumer (the acknowledged source, the
// requester, peek, replay) use, named here and nowhere else: `consume/`'s files are private.
#[cfg(test)]
pub(crate) use ladder::copies::copy_of;
pub(crate) use ladder::copies::{dead_letter_copy, publish_copy};
pub(crate) use ladder::plan::exhausted;
pub(crate) use ladder::policy::declare_failure_topology;
pub use ladder::policy::{
    failure_topology, FailureTopology, RetryPolicy, DEFAULT_BROKER_WAIT_THRESHOLD,
};
pub use options::ConsumerOptions;
pub(crate) use outcome::format_duration;
pub use outcome::{Handler, HandlerResult, OrderBy, Outcome};
pub(crate) use owner::put_back::replace_counted;
pub(crate) use owner::subscribe::cancel_and_drain;
pub use report::CloseReport;
pub use running::RunningConsumer;
