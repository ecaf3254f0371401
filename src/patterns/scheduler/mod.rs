//! Delayed delivery on a TTL ladder, the AceMQ family's scheduler.
//!
//! A classic queue expires messages only at its head, so one queue holding mixed delays
//! releases a one-minute message behind a four-hour one four hours late. The scheduler
//! instead keeps a *ladder* of rungs, each a classic queue with one `x-message-ttl`, so the
//! head of a rung is always the message due soonest. A rung dead-letters what expires through
//! the `acemq.schedule` exchange to the control queue `acemq.schedule.due`, whose consumer puts
//! the message on the next rung or delivers it.
//!
//! What is promised, exactly (the family's contract, `tests/fixtures/schedule_topology.json`):
//!
//! * **Topology** ([`schedule_topology`]): exchange `acemq.schedule` (direct, durable); rungs
//!   `acemq.schedule.{1h,10m,1m,10s,1s}`, durable classic queues (`x-queue-type: classic`, equal to none for the broker) with
//!   exactly three arguments: `x-message-ttl` (ms), `x-dead-letter-exchange: acemq.schedule`,
//!   `x-dead-letter-routing-key: acemq.schedule.due`; the control queue `acemq.schedule.due`,
//!   durable, classic, no arguments; every queue bound to `acemq.schedule` under its own name.
//!   A broker where another service (in any language) declared the same already is fine — an
//!   integer TTL of any width is the same to RabbitMQ; a queue of one of these names with other
//!   arguments fails [`Scheduler::start`] with [`Error::TopologyConflict`](crate::Error::TopologyConflict) and the connection
//!   stays usable. No `.dlq` or `.parked` is declared for these shared names.
//! * **Hops.** A message waits on the largest rung that does not overshoot what is left until
//!   it is due (by more than half the smallest rung: the slack that absorbs the hops' own
//!   milliseconds); with less than half the smallest rung (0.5 s) left, it is delivered. A 90 s
//!   delay hops `1m`, `10s`, `10s`, `10s` ([`hop_plan`]); a delivery lands within about half a
//!   second of its due time plus the last hop's own time. (The Go library delivers once less
//!   than a whole smallest rung is left, up to 1 s early; the wire is the same.) Between rungs the message is envelope type `ScheduledMessage`,
//!   content type `application/octet-stream`, and carries the family's four headers
//!   `x-schedule-exchange`, `x-schedule-routing-key`, `x-schedule-due-at` (epoch ms) and
//!   `x-schedule-content-type`.
//! * **Delivery.** The body is moved as bytes, never decoded, under the content type it was
//!   scheduled with (`application/json` when none was recorded). The destination gets a
//!   **fresh envelope** of type `ScheduledMessage` (attempt 1, first seen at delivery) and none
//!   of the four headers; the application headers of the scheduled message go with it (the
//!   broker's `x-death` bookkeeping does not). Its id is the id the message was scheduled with,
//!   kept on every hop, so a duplicate (a crash between a confirmed hop and its
//!   acknowledgement) carries the same id and an idempotent consumer drops it.
//! * **Nothing is lost.** Every hop and delivery is published mandatory and confirmed
//!   **before** the control message is acknowledged. A due message that no queue receives
//!   (unroutable) is kept: logged, put back on the 10 s rung and tried again until its queue
//!   exists. A hop or delivery that fails otherwise (connection lost, …) puts the control
//!   message back after 2 s. A control message without the scheduler's headers (or with an
//!   unreadable due time) is not the scheduler's: it is rejected — logged at error, counted in
//!   [`RunningScheduler::rejected`] and dropped (the shared control queue has no dead-letter queue) —
//!   never retried.
//! * **Sharing.** Several schedulers on one broker (this crate's or another library's) share
//!   the topology and the work: any of them moves any message.
//! * **Counters.** [`RunningScheduler::scheduled`], [`RunningScheduler::delivered`],
//!   [`RunningScheduler::hops`]
//!   (this scheduler's work since it started).
//!
//! [`SchedulerOptions`] can give a scheduler another base name and ladder (for tests, or a
//! separate ladder); the family's names are the default and the only ones other libraries use.

mod control;
mod options;
mod running;
mod topology;

pub use options::SchedulerOptions;
pub use running::{RunningScheduler, Scheduler};
pub use topology::{
    hop_plan, hop_plan_on, schedule_rungs, schedule_topology, ScheduleTopology,
    SCHEDULED_MESSAGE_TYPE, SCHEDULE_CONTROL_QUEUE, SCHEDULE_EXCHANGE,
};
