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
//!   `acemq.schedule.{1h,10m,1m,10s,1s}`, durable classic queues (no `x-queue-type`) with
//!   exactly three arguments: `x-message-ttl` (ms), `x-dead-letter-exchange: acemq.schedule`,
//!   `x-dead-letter-routing-key: acemq.schedule.due`; the control queue `acemq.schedule.due`,
//!   durable, classic, no arguments; every queue bound to `acemq.schedule` under its own name.
//!   A broker where another service (in any language) declared the same already is fine — an
//!   integer TTL of any width is the same to RabbitMQ; a queue of one of these names with other
//!   arguments fails [`Scheduler::open`] with [`Error::TopologyConflict`] and the connection
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
//!   [`Scheduler::rejected`] and dropped (the shared control queue has no dead-letter queue) —
//!   never retried.
//! * **Sharing.** Several schedulers on one broker (this crate's or another library's) share
//!   the topology and the work: any of them moves any message.
//! * **Counters.** [`Scheduler::scheduled`], [`Scheduler::delivered`], [`Scheduler::hops`]
//!   (this scheduler's work since it opened).
//!
//! [`SchedulerOptions`] can give a scheduler another base name and ladder (for tests, or a
//! separate ladder); the family's names are the default and the only ones other libraries use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::connection::{Binding, Connection, ExchangeSpec, QueueSpec};
use crate::consume::{CloseReport, ConsumerOptions, HandlerResult, Outcome, RunningConsumer};
use crate::envelope::{check_name, headers, now_ms, HeaderValue, Message};
use crate::error::FatalError;
use crate::error::{Error, Result};
use crate::publish::Publisher;

/// The family's scheduler exchange.
pub const SCHEDULE_EXCHANGE: &str = "acemq.schedule";
/// The family's control queue.
pub const SCHEDULE_CONTROL_QUEUE: &str = "acemq.schedule.due";
/// The envelope type of a scheduled message, between rungs and on delivery.
pub const SCHEDULED_MESSAGE_TYPE: &str = "ScheduledMessage";
/// The content type a delivery gets when none was recorded.
const DEFAULT_CONTENT_TYPE: &str = "application/json";
/// The control consumer's prefetch, as in Go and Java.
const CONTROL_PREFETCH: u16 = 50;
/// How long a control message waits before another try when its hop or delivery failed.
const FAILED_HOP_PAUSE: Duration = Duration::from_secs(2);
/// Where a due message that reached no queue waits before it is tried again.
const KEEP_WAIT: Duration = Duration::from_secs(10);

/// The family's rungs, longest first: 1 h, 10 min, 1 min, 10 s, 1 s.
pub fn schedule_rungs() -> Vec<Duration> {
    [3_600, 600, 60, 10, 1]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

/// A rung's suffix: whole hours `Nh`, whole minutes `Nm`, else seconds `Ns`.
fn rung_suffix(rung: Duration) -> String {
    let ms = rung.as_millis();
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1_000)
    }
}

/// The rung that a message with `remaining` left waits on next, or `None` when it is due.
/// `rungs` is longest first. The largest rung that does not overshoot by more than half the
/// smallest rung; due when less than that half is left. The slack absorbs the time the hops
/// themselves take: a 90 s delay really hops `1m, 10s, 10s, 10s` (without it, each hop's few
/// milliseconds would turn the last `10s` into nine `1s` hops), and a delivery lands within half
/// the smallest rung of its due time rather than up to a whole rung early.
fn next_rung(rungs: &[Duration], remaining: Duration) -> Option<Duration> {
    let slack = rungs.last().copied().unwrap_or_default() / 2;
    if remaining < slack {
        return None;
    }
    rungs.iter().copied().find(|r| *r <= remaining + slack)
}

/// The rungs a message scheduled `delay` ahead waits on, in order, if the hops took no time of
/// their own. On the family's ladder: 90 s → `[1m, 10s, 10s, 10s]`, 4 h → four `1h`, 400 ms →
/// none (delivered at once).
pub fn hop_plan(delay: Duration) -> Vec<Duration> {
    hop_plan_on(&schedule_rungs(), delay)
}

/// [`hop_plan`] on another ladder (any order).
pub fn hop_plan_on(rungs: &[Duration], delay: Duration) -> Vec<Duration> {
    let mut sorted: Vec<Duration> = rungs.iter().copied().filter(|r| !r.is_zero()).collect();
    sorted.sort_by(|a, b| b.cmp(a));
    let mut plan = Vec::new();
    let mut remaining = delay;
    while let Some(rung) = next_rung(&sorted, remaining) {
        plan.push(rung);
        remaining = remaining.saturating_sub(rung);
    }
    plan
}

/// Everything a scheduler declares: one exchange, the rungs and the control queue, and their
/// bindings.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleTopology {
    /// The scheduler's exchange.
    pub exchange: ExchangeSpec,
    /// The rungs (longest first), then the control queue.
    pub queues: Vec<QueueSpec>,
    /// Each queue bound to the exchange under its own name.
    pub bindings: Vec<Binding>,
}

impl ScheduleTopology {
    /// Declares it all (and remembers it for re-declaration after recovery). Each declaration
    /// runs on a channel of its own, so a conflict leaves the connection usable.
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`] when one of the queues exists with other arguments.
    pub fn apply(&self, connection: &Connection) -> Result<()> {
        connection.declare_exchange(&self.exchange)?;
        for q in &self.queues {
            connection.declare_queue(q)?;
        }
        for b in &self.bindings {
            connection.bind(b)?;
        }
        Ok(())
    }
}

/// The family's scheduler topology (see the [module docs](self)).
pub fn schedule_topology() -> ScheduleTopology {
    SchedulerOptions::default().topology()
}

/// Options for [`Scheduler::open_with`].
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    base: String,
    rungs: Vec<Duration>,
    concurrency: usize,
    shutdown_timeout: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            base: SCHEDULE_EXCHANGE.to_string(),
            rungs: schedule_rungs(),
            concurrency: 1,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

impl SchedulerOptions {
    /// Default options: the family's names and ladder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The base name: the exchange, `{base}.{rung}` the rungs, `{base}.due` the control queue.
    /// Only the default is shared with other libraries. Defaults to `acemq.schedule`.
    pub fn base(mut self, base: impl Into<String>) -> Self {
        self.base = base.into();
        self
    }

    /// The rungs (each a whole number of seconds, at least 1 s). Defaults to 1 h, 10 min,
    /// 1 min, 10 s, 1 s.
    pub fn rungs(mut self, rungs: impl IntoIterator<Item = Duration>) -> Self {
        let mut rungs: Vec<Duration> = rungs.into_iter().collect();
        rungs.sort_by(|a, b| b.cmp(a));
        rungs.dedup();
        self.rungs = rungs;
        self
    }

    /// Worker threads moving control messages. Defaults to 1.
    pub fn concurrency(mut self, workers: usize) -> Self {
        self.concurrency = workers;
        self
    }

    /// How long closing waits for a hop under way. Defaults to 30 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    fn control_queue(&self) -> String {
        format!("{}.due", self.base)
    }

    fn rung_queue(&self, rung: Duration) -> String {
        format!("{}.{}", self.base, rung_suffix(rung))
    }

    fn validate(&self) -> Result<()> {
        check_name("exchange", &self.base, false)?;
        check_name("queue", &self.control_queue(), false)?;
        if self.rungs.is_empty() {
            return Err(Error::invalid("a scheduler needs at least one rung"));
        }
        for r in &self.rungs {
            if r.as_secs() == 0 || r.subsec_nanos() != 0 {
                return Err(Error::invalid(format!(
                    "scheduler rung {r:?}: rungs are whole seconds, at least 1 s"
                )));
            }
            check_name("queue", &self.rung_queue(*r), false)?;
        }
        if self.concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        Ok(())
    }

    /// What a scheduler with these options declares.
    pub fn topology(&self) -> ScheduleTopology {
        let exchange = ExchangeSpec::direct(self.base.clone());
        let mut queues: Vec<QueueSpec> = self
            .rungs
            .iter()
            .map(|r| {
                QueueSpec::new(self.rung_queue(*r))
                    .classic()
                    .message_ttl(*r)
                    .dead_letter_exchange(self.base.clone())
                    .dead_letter_routing_key(self.control_queue())
            })
            .collect();
        queues.push(QueueSpec::new(self.control_queue()).classic());
        let bindings = queues
            .iter()
            .map(|q| {
                Binding::new()
                    .queue(q.name())
                    .exchange(self.base.clone())
                    .routing_key(q.name())
            })
            .collect();
        ScheduleTopology {
            exchange,
            queues,
            bindings,
        }
    }
}

/// What the scheduler's threads share.
#[derive(Debug)]
struct Inner {
    options: SchedulerOptions,
    publisher: Publisher,
    scheduled: AtomicU64,
    delivered: AtomicU64,
    hops: AtomicU64,
    rejected: AtomicU64,
}

/// A scheduled message as it travels: body, the four headers and the application's headers.
struct Scheduled {
    id: String,
    body: Vec<u8>,
    exchange: String,
    routing_key: String,
    due_ms: i64,
    /// The application's headers, the four scheduler headers among them as received.
    headers: std::collections::BTreeMap<String, HeaderValue>,
    /// The header table as received, so that unchanged headers keep their AMQP types.
    received: Option<Arc<amiquip::FieldTable>>,
}

/// Delivers messages later, by hops down a TTL ladder (see the [module docs](self)).
///
/// ```no_run
/// use acemq_amqp::patterns::scheduler::Scheduler;
/// use acemq_amqp::{Connection, Message};
/// use std::time::Duration;
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
/// let scheduler = Scheduler::open(&connection)?;
/// let invoice = Message::encode(connection.codec().as_ref(), &serde_json::json!({"n": 7}))?;
/// scheduler.after(Duration::from_secs(4 * 3600), "billing", "invoice.due", invoice)?;
/// scheduler.close()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Scheduler {
    inner: Arc<Inner>,
    consumer: Option<RunningConsumer>,
}

impl Scheduler {
    /// Declares the family's topology and starts the control consumer.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(connection: &Connection) -> Result<Scheduler> {
        Scheduler::open_with(connection, SchedulerOptions::default())
    }

    /// Declares the topology of `options` and starts the control consumer (prefetch 50, on
    /// threads of its own).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] / [`Error::InvalidName`] for bad options;
    /// [`Error::TopologyConflict`] when a queue of the scheduler's exists with other arguments
    /// (the connection stays usable).
    pub fn open_with(connection: &Connection, options: SchedulerOptions) -> Result<Scheduler> {
        options.validate()?;
        options.topology().apply(connection)?;
        let publisher = connection.publisher()?;
        let control = options.control_queue();
        let consumer_options = ConsumerOptions::new()
            .declare(false)
            .prefetch(CONTROL_PREFETCH)
            .concurrency(options.concurrency)
            .shutdown_timeout(options.shutdown_timeout)
            .any_attempt();
        let inner = Arc::new(Inner {
            options,
            publisher,
            scheduled: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            hops: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        });
        let handler_inner = inner.clone();
        let consumer = connection
            .consumer(&control, consumer_options)?
            .start(move |m: &Message| handler_inner.on_control(m))?;
        Ok(Scheduler {
            inner,
            consumer: Some(consumer),
        })
    }

    /// Delivers `message` to `exchange` with `routing_key` after `delay` (now when it is under
    /// the smallest rung). Its body and content type are kept; its envelope is not (the
    /// delivery gets a fresh one of type `ScheduledMessage` with the same id).
    ///
    /// # Errors
    ///
    /// As [`at`](Self::at).
    pub fn after(
        &self,
        delay: Duration,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.schedule(
            now_ms().saturating_add(delay_ms),
            exchange,
            routing_key,
            message,
        )
    }

    /// Delivers `message` at `moment` (an instant with its offset: a naive time cannot be
    /// given); a moment in the past delivers now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty routing key or names over 255 bytes;
    /// [`Error::InvalidHeader`] for a header that cannot be sent; a publish error when the
    /// first hop (or an immediate delivery) could not be confirmed — then nothing was
    /// scheduled. A due message that no queue receives is not an error: it is kept.
    pub fn at(
        &self,
        moment: OffsetDateTime,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        let due_ms = i64::try_from(moment.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        self.schedule(due_ms, exchange, routing_key, message)
    }

    fn schedule(
        &self,
        due_ms: i64,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        check_name("exchange", exchange, true)?;
        check_name("routing key", routing_key, false)?;
        message.validate()?;
        let mut headers = message.headers;
        strip_scheduler_headers(&mut headers);
        headers.insert(headers::SCHEDULE_EXCHANGE.into(), exchange.into());
        headers.insert(headers::SCHEDULE_ROUTING_KEY.into(), routing_key.into());
        headers.insert(headers::SCHEDULE_DUE_AT.into(), HeaderValue::Int(due_ms));
        if let Some(ct) = &message.content_type {
            headers.insert(headers::SCHEDULE_CONTENT_TYPE.into(), ct.clone().into());
        }
        let scheduled = Scheduled {
            id: message.envelope.id,
            body: message.body,
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            due_ms,
            headers,
            received: None,
        };
        self.inner.route(scheduled)?;
        self.inner.scheduled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Messages handed to this scheduler ([`after`](Self::after), [`at`](Self::at)).
    pub fn scheduled(&self) -> u64 {
        self.inner.scheduled.load(Ordering::Relaxed)
    }

    /// Messages this scheduler delivered to their destination.
    pub fn delivered(&self) -> u64 {
        self.inner.delivered.load(Ordering::Relaxed)
    }

    /// Moves of a message onto a rung by this scheduler (a due message kept on the 10 s rung
    /// because no queue received it counts too).
    pub fn hops(&self) -> u64 {
        self.inner.hops.load(Ordering::Relaxed)
    }

    /// Control messages without the scheduler's headers, dropped.
    pub fn rejected(&self) -> u64 {
        self.inner.rejected.load(Ordering::Relaxed)
    }

    /// The control queue this scheduler consumes.
    pub fn control_queue(&self) -> String {
        self.inner.options.control_queue()
    }

    /// Stops the control consumer (a hop under way finishes and is acknowledged) and closes
    /// the publisher.
    ///
    /// # Errors
    ///
    /// The error that ended the control consumer, if it ended on its own.
    pub fn close(mut self) -> Result<CloseReport> {
        let report = match self.consumer.take() {
            Some(c) => c.close(),
            None => Ok(CloseReport::default()),
        };
        let _ = self.inner.publisher.close();
        report
    }
}

impl Drop for Scheduler {
    /// Closes as [`close`](Scheduler::close) does (blocking up to the shutdown timeout).
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            if let Err(e) = c.close() {
                log::warn!("acemq: the scheduler's control consumer ended with: {e}");
            }
            let _ = self.inner.publisher.close();
        }
    }
}

/// Removes the four scheduler headers and the broker's dead-letter bookkeeping.
fn strip_scheduler_headers(h: &mut std::collections::BTreeMap<String, HeaderValue>) {
    h.retain(|k, _| {
        !(k == headers::SCHEDULE_EXCHANGE
            || k == headers::SCHEDULE_ROUTING_KEY
            || k == headers::SCHEDULE_DUE_AT
            || k == headers::SCHEDULE_CONTENT_TYPE
            || is_broker_header(k))
    });
}

fn is_broker_header(name: &str) -> bool {
    name == "x-delivery-count"
        || name.starts_with("x-death")
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// Text from a header written as a string or bytes.
fn text(v: Option<&HeaderValue>) -> Option<String> {
    match v? {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

/// An integer written in any width or as decimal text.
fn integer(v: Option<&HeaderValue>) -> Option<i64> {
    match v? {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        HeaderValue::Float(f) if f.is_finite() => Some(*f as i64),
        HeaderValue::Timestamp(t) => i64::try_from(*t).ok()?.checked_mul(1000),
        _ => None,
    }
}

impl Inner {
    /// A control message: a scheduled message out of a rung (or put straight on the control
    /// queue by another scheduler).
    fn on_control(&self, m: &Message) -> HandlerResult {
        let exchange = text(m.headers.get(headers::SCHEDULE_EXCHANGE));
        let routing_key = text(m.headers.get(headers::SCHEDULE_ROUTING_KEY));
        let due = integer(m.headers.get(headers::SCHEDULE_DUE_AT));
        let (Some(exchange), Some(routing_key), Some(due_ms)) = (exchange, routing_key, due) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            let why = FatalError::new(format!(
                "message {} on {:?} is not a scheduled message (it lacks {}, {} or a readable \
                 {}): something other than a scheduler publishes to the scheduler's queues; it \
                 is dropped",
                m.id(),
                self.options.control_queue(),
                headers::SCHEDULE_EXCHANGE,
                headers::SCHEDULE_ROUTING_KEY,
                headers::SCHEDULE_DUE_AT
            ));
            log::error!("acemq: scheduler: {why}");
            return Ok(Outcome::Accept);
        };
        let scheduled = Scheduled {
            id: m.id().to_string(),
            body: m.body.clone(),
            exchange,
            routing_key,
            due_ms,
            headers: m.headers.clone(),
            received: m
                .properties
                .as_ref()
                .and_then(|p| p.headers().clone())
                .map(Arc::new),
        };
        match self.route(scheduled) {
            Ok(()) => Ok(Outcome::Accept),
            Err(e) => {
                log::warn!(
                    "acemq: scheduler: could not move message {} on ({e}); it is tried again \
                     in {FAILED_HOP_PAUSE:?}",
                    m.id()
                );
                Ok(Outcome::in_progress(FAILED_HOP_PAUSE))
            }
        }
    }

    /// Puts the message on its next rung, or delivers it when due.
    fn route(&self, s: Scheduled) -> Result<()> {
        let remaining = u64::try_from(s.due_ms.saturating_sub(now_ms())).unwrap_or(0);
        match next_rung(&self.options.rungs, Duration::from_millis(remaining)) {
            Some(rung) => self.hop(s, rung),
            None => self.deliver(s),
        }
    }

    fn hop(&self, s: Scheduled, rung: Duration) -> Result<()> {
        let queue = self.options.rung_queue(rung);
        let mut m = Message::new(s.body)
            .with_id(s.id)
            .message_type(SCHEDULED_MESSAGE_TYPE)
            .content_type("application/octet-stream");
        m.headers = s.headers;
        m.headers.retain(|k, _| !is_broker_header(k));
        m.received_headers = s.received;
        self.publisher.publish(&self.options.base, &queue, m)?;
        self.hops.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn deliver(&self, s: Scheduled) -> Result<()> {
        let content_type = text(s.headers.get(headers::SCHEDULE_CONTENT_TYPE))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_string());
        let mut application = s.headers.clone();
        strip_scheduler_headers(&mut application);
        // A copy of the body: kept (on a rung) when no queue receives the delivery.
        let mut m = Message::new(s.body.clone())
            .with_id(s.id.clone())
            .message_type(SCHEDULED_MESSAGE_TYPE)
            .content_type(content_type);
        m.headers = application;
        m.received_headers = s.received.clone();
        match self.publisher.publish(&s.exchange, &s.routing_key, m) {
            Ok(()) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(Error::Unroutable { .. }) => self.keep(s),
            Err(e) => Err(e),
        }
    }

    /// A due message no queue received: back on the rung nearest 10 s, to be tried again.
    fn keep(&self, s: Scheduled) -> Result<()> {
        let rung = self
            .options
            .rungs
            .iter()
            .copied()
            .min_by_key(|r| r.abs_diff(KEEP_WAIT))
            .unwrap_or(KEEP_WAIT);
        log::warn!(
            "acemq: scheduler: message {} is due but no queue receives it on exchange {:?} \
             with routing key {:?}; it is kept on {:?} and tried again",
            s.id,
            s.exchange,
            s.routing_key,
            self.options.rung_queue(rung)
        );
        self.hop(s, rung)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rung_names_are_the_familys() {
        let names: Vec<String> = schedule_rungs().into_iter().map(rung_suffix).collect();
        assert_eq!(names, ["1h", "10m", "1m", "10s", "1s"]);
    }

    #[test]
    fn next_rung_is_the_largest_that_does_not_overshoot_by_more_than_half_a_second() {
        let rungs = schedule_rungs();
        let ms = Duration::from_millis;
        assert_eq!(next_rung(&rungs, ms(499)), None);
        assert_eq!(next_rung(&rungs, ms(500)), Some(ms(1_000)));
        assert_eq!(next_rung(&rungs, ms(9_990)), Some(ms(10_000)));
        assert_eq!(next_rung(&rungs, ms(9_400)), Some(ms(1_000)));
        assert_eq!(next_rung(&rungs, ms(59_000)), Some(ms(10_000)));
        assert_eq!(next_rung(&rungs, ms(59_600)), Some(ms(60_000)));
    }

    #[test]
    fn a_90_s_delay_hops_as_planned_even_when_each_hop_takes_time() {
        // Each hop 30 ms late, as a real broker round trip is.
        let rungs = schedule_rungs();
        let mut remaining = Duration::from_secs(90);
        let mut hops = Vec::new();
        while let Some(r) = next_rung(&rungs, remaining) {
            hops.push(rung_suffix(r));
            remaining = remaining.saturating_sub(r + Duration::from_millis(30));
        }
        assert_eq!(hops, ["1m", "10s", "10s", "10s"]);
    }
}
