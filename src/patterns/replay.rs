//! Dead-letter replay: move messages from a queue (usually a `{queue}.dlq`) back to where they
//! were going, once whatever killed them is fixed.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq_amqp::{dead_letter_queue, Connection};
//! use acemq_amqp::patterns::replay::replay;
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let report = replay(&connection, &dead_letter_queue("orders"))
//!     .only(|envelope, _body| envelope.error.as_deref().unwrap_or("").contains("timeout"))
//!     .limit(500)
//!     .deadline(Duration::from_secs(60))
//!     .run()?;
//! println!("{report}"); // moved 137, skipped 363 (drained)
//! # Ok(()) }
//! ```
//!
//! # What is promised
//!
//! * **Nothing is lost.** Each message is republished **mandatory, with a publisher confirm**,
//!   and only then is the original acknowledged. A crash (or a `SIGKILL`) in between leaves the
//!   original on the source queue as well as the copy at its destination: a duplicate, never a
//!   loss. A copy that reaches no queue (the destination was deleted, nothing is bound) or is
//!   refused is a failure: its original stays on the source queue, the pass stops, and
//!   [`Replay::run`] returns [`Error::Replay`] carrying the report so far.
//! * **Stamps** (the family's names, unprefixed application headers so every library's handler
//!   sees them): `acemq-replayed-from` = the source queue, `acemq-replayed-at` = the instant as
//!   RFC 3339 in UTC with whole seconds (`2026-11-30T14:12:36Z`, as the Go library writes it;
//!   every library reads it), `acemq-replay-count` = the previous count (read forgivingly: any
//!   integer width or decimal text; missing → 0) plus one. The id, correlation, causation, type,
//!   first-seen time, body, content type and every other header stay as they were (a header
//!   another client wrote that cannot be sent back, such as a non-finite float, is dropped
//!   rather than leaving the message stuck).
//! * **Restart** (default on): attempt back to 1 and `x-acemq-error` cleared, so a message that
//!   died on its last attempt gets a full set of attempts again. `restart(false)` keeps both.
//! * **Where a message goes.** Exchange: [`Replay::exchange`], else the exchange the message
//!   was first published to when that is known and not the default exchange, else the default
//!   exchange to the queue it was dead-lettered from. Routing key: [`Replay::routing_key`], else
//!   its own original routing key (to the original queue when it goes through the default
//!   exchange). What is known is read from `acemq-original-exchange`,
//!   `acemq-original-routing-key` and `acemq-original-queue` (which this crate's consumer writes
//!   on its retry, dead-letter and parked copies when they are not there yet), else from the
//!   broker's own dead-lettering headers (`x-first-death-exchange`, `x-first-death-queue`, the
//!   routing keys in `x-death`), else from the source queue's name (`orders.dlq` and
//!   `orders.parked` came from `orders`). A message whose destination cannot be worked out, or
//!   that would go back to the source queue itself, stops the pass with [`Error::Replay`]
//!   (nothing is lost; set [`Replay::exchange`] / [`Replay::routing_key`]).
//!
//! # How a pass reads: `basic.get` and a window
//!
//! A pass reads the source queue with `basic.get` on a channel of its own, one message at a
//! time (a read costs one round trip, a move one publisher confirm; moves are not pipelined). `basic.get` tells "empty" apart from "nothing yet", so a pass ends exactly
//! when there is nothing left to offer: [`Stopped::Drained`]. Messages the filter declines are
//! **held unacknowledged until the pass ends, then returned all at once** (one `basic.nack`,
//! `multiple`, requeue), so they stay on the source queue in their original order; returning
//! one at once would put it back at the head and the pass would read it for ever. A held
//! message costs the broker, not this process (nothing of it is kept here), but the number held
//! is bounded by [`Replay::window`] (default 10 000): a pass that has declined that many stops
//! with [`Stopped::Window`]. A crash returns held messages too: the broker requeues what an
//! ended channel held.
//!
//! A pass also stops after [`Replay::limit`] messages matched ([`Stopped::Limit`]) or once
//! [`Replay::deadline`] has passed ([`Stopped::Deadline`]); both are checked between messages
//! (a move in progress finishes, bounded by the publisher's timeout). Against a queue that is
//! still being written to, a pass without a limit or deadline may not end: prefer one.
//!
//! # For a tool
//!
//! [`Replay::dry_run`] reads and filters without moving anything (every message read is held
//! and returned at the end, so the window bounds a dry run's reads): [`ReplayReport::matched`]
//! says how many would move. Progress goes to the connection's [`Observer`] (or
//! [`Replay::observer`]) every [`Replay::progress_every`] messages read and once at the end,
//! for a progress bar. The report's `Display` is one line: `moved 137, skipped 363 (drained)`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connection::Connection;
use crate::envelope::{check_name, headers, Envelope, HeaderValue, Message};
use crate::error::{Error, Result};
use crate::observe::{Observer, ReplayEvent};

/// Why a replay pass stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// The source queue had nothing more to offer.
    Drained,
    /// [`Replay::limit`] messages matched.
    Limit,
    /// [`Replay::deadline`] passed.
    Deadline,
    /// [`Replay::window`] messages were held (declined, or read by a dry run).
    Window,
    /// A failure stopped it (only in the report inside [`Error::Replay`]).
    Failed,
}

impl Stopped {
    /// `drained`, `limit`, `deadline`, `window` or `failed`, as the family reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stopped::Drained => "drained",
            Stopped::Limit => "limit",
            Stopped::Deadline => "deadline",
            Stopped::Window => "window",
            Stopped::Failed => "failed",
        }
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a replay pass did, and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The queue read.
    pub queue: String,
    /// Republished, confirmed, and acknowledged on the source queue.
    pub moved: u64,
    /// Declined by the filter: still on the source queue, in their order.
    pub skipped: u64,
    /// Accepted by the filter: equal to `moved` in a pass that ran to its end, the ones that
    /// would move in a dry run, one more than `moved` when a move failed.
    pub matched: u64,
    /// True for a [`Replay::dry_run`] pass.
    pub dry_run: bool,
    /// Why it stopped.
    pub stopped: Stopped,
    /// How long it ran.
    pub elapsed: Duration,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dry_run {
            write!(
                f,
                "dry run: would move {}, skipped {} ({})",
                self.matched, self.skipped, self.stopped
            )
        } else {
            write!(
                f,
                "moved {}, skipped {} ({})",
                self.moved, self.skipped, self.stopped
            )
        }
    }
}

type Filter<'a> = Box<dyn FnMut(&Message) -> bool + 'a>;

/// A replay pass being configured: see [`replay`] and the [module docs](self).
#[must_use = "a replay does nothing until run() is called"]
pub struct Replay<'a> {
    connection: &'a Connection,
    source: String,
    limit: Option<u64>,
    deadline: Option<Duration>,
    filter: Option<Filter<'a>>,
    routing_key: Option<String>,
    exchange: Option<String>,
    restart: bool,
    window: usize,
    progress_every: u64,
    dry_run: bool,
    observer: Option<Arc<dyn Observer>>,
}

impl fmt::Debug for Replay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("source", &self.source)
            .field("limit", &self.limit)
            .field("deadline", &self.deadline)
            .field("filtered", &self.filter.is_some())
            .field("routing_key", &self.routing_key)
            .field("exchange", &self.exchange)
            .field("restart", &self.restart)
            .field("window", &self.window)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

/// A replay of `source_queue` (usually [`dead_letter_queue`](crate::dead_letter_queue)`(queue)`)
/// on `connection`; configure it, then [`Replay::run`] it.
pub fn replay<'a>(connection: &'a Connection, source_queue: &str) -> Replay<'a> {
    Replay {
        connection,
        source: source_queue.to_string(),
        limit: None,
        deadline: None,
        filter: None,
        routing_key: None,
        exchange: None,
        restart: true,
        window: 10_000,
        progress_every: 100,
        dry_run: false,
        observer: None,
    }
}

impl<'a> Replay<'a> {
    /// Stops after this many messages matched (moved, or in a dry run would move). Defaults to
    /// no limit.
    pub fn limit(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// Stops once this long has passed since [`run`](Self::run) began (checked between
    /// messages). Defaults to none.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Moves only the messages for which `filter(envelope, body)` is true; the others stay on the
    /// source queue in their order. Defaults to every message.
    pub fn only(mut self, mut filter: impl FnMut(&Envelope, &[u8]) -> bool + 'a) -> Self {
        self.filter = Some(Box::new(move |m: &Message| filter(&m.envelope, &m.body)));
        self
    }

    /// As [`only`](Self::only), with the whole received message (application headers, routing
    /// key, …) to decide on.
    pub fn only_message(mut self, filter: impl FnMut(&Message) -> bool + 'a) -> Self {
        self.filter = Some(Box::new(filter));
        self
    }

    /// Publishes every message with this routing key. Defaults to each message's own original
    /// routing key (see the [module docs](self)).
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// Publishes every message to this exchange (`""` for the default exchange). Defaults to the
    /// exchange each was first published to, else the default exchange to its original queue.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = Some(exchange.into());
        self
    }

    /// True: attempt back to 1 and the error cleared; false: both kept. Defaults to true.
    pub fn restart(mut self, restart: bool) -> Self {
        self.restart = restart;
        self
    }

    /// The most messages held unacknowledged in one pass (declined ones, or every one read in a
    /// dry run); reaching it stops the pass with [`Stopped::Window`]. At least 1. Defaults to
    /// 10 000.
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// Reports progress to the observer every `n` messages read (and once at the end). 0 reports
    /// only the end. Defaults to 100.
    pub fn progress_every(mut self, n: u64) -> Self {
        self.progress_every = n;
        self
    }

    /// True: read and filter, move nothing; every message read goes back at the end. Defaults to
    /// false.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Where progress goes. Defaults to the connection's observer.
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(crate::observe::Guarded::wrap(observer));
        self
    }

    /// Runs one pass (on the calling thread) and reports what it did.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] / [`Error::InvalidArgument`] for a bad queue, exchange, routing
    /// key or window, before anything is read. Once the pass has begun, every failure —
    /// the source queue missing ([`Error::NotFound`] inside), a copy unroutable, nacked or
    /// unconfirmed, a destination that cannot be worked out, the connection lost — is
    /// [`Error::Replay`] with the report so far (its `stopped` is [`Stopped::Failed`]) and the
    /// cause; the message being moved and every held one are back on the source queue.
    pub fn run(mut self) -> Result<ReplayReport> {
        check_name("queue", &self.source, false)?;
        if let Some(e) = &self.exchange {
            check_name("exchange", e, true)?;
        }
        if let Some(k) = &self.routing_key {
            check_name("routing key", k, true)?;
        }
        if self.window == 0 {
            return Err(Error::invalid("a replay window must be at least 1"));
        }
        let observer = self
            .observer
            .take()
            .unwrap_or_else(|| self.connection.observer().clone());
        let started = Instant::now();
        let mut report = ReplayReport {
            queue: self.source.clone(),
            moved: 0,
            skipped: 0,
            matched: 0,
            dry_run: self.dry_run,
            stopped: Stopped::Drained,
            elapsed: Duration::ZERO,
        };
        let mut pass = Pass {
            replay: &mut self,
            report: &mut report,
            observer: &observer,
            started,
            read: 0,
        };
        let result = pass.run();
        report.elapsed = started.elapsed();
        match result {
            Ok(stopped) => {
                report.stopped = stopped;
                observer.replay(&ReplayEvent {
                    report: &report,
                    finished: true,
                });
                log::info!("acemq: replay of {:?}: {report}", report.queue);
                Ok(report)
            }
            Err(source) => {
                report.stopped = Stopped::Failed;
                observer.replay(&ReplayEvent {
                    report: &report,
                    finished: true,
                });
                log::error!(
                    "acemq: replay of {:?} stopped after {report}: {source}",
                    report.queue
                );
                Err(Error::Replay {
                    report: Box::new(report),
                    source: Box::new(source),
                })
            }
        }
    }
}

/// One pass under way.
struct Pass<'p, 'a> {
    replay: &'p mut Replay<'a>,
    report: &'p mut ReplayReport,
    observer: &'p Arc<dyn Observer>,
    started: Instant,
    read: u64,
}

impl Pass<'_, '_> {
    fn run(&mut self) -> Result<Stopped> {
        let source = self.replay.source.clone();
        let (channel, _link) = self.replay.connection.open_channel()?;
        // Fail with NotFound rather than a closed channel when the queue is not there.
        channel
            .queue_declare_passive(source.as_str())
            .map_err(|e| Error::from_amqp_on("queue", &source, "checking", e))?;
        let publisher = if self.replay.dry_run {
            None
        } else {
            Some(self.replay.connection.publisher()?)
        };
        let mut held = 0usize;
        let result = self.read_loop(&channel, publisher.as_ref(), &mut held);
        // Return what is held (declined, dry-run reads, the message whose move failed) all at
        // once, in order: nack `multiple` with tag 0 covers every unacknowledged delivery.
        let returned = channel.nack_all(true);
        if let Err(e) = &returned {
            log::warn!(
                "acemq: could not return {held} held message(s) to {source:?} ({e}); the broker \
                 returns them as the channel closes"
            );
        }
        let _ = channel.close();
        if let Some(p) = publisher {
            let _ = p.close();
        }
        result
    }

    fn read_loop(
        &mut self,
        channel: &amiquip::Channel,
        publisher: Option<&crate::Publisher>,
        held: &mut usize,
    ) -> Result<Stopped> {
        let source = self.replay.source.clone();
        loop {
            if self.replay.limit.is_some_and(|l| self.report.matched >= l) {
                return Ok(Stopped::Limit);
            }
            if self
                .replay
                .deadline
                .is_some_and(|d| self.started.elapsed() >= d)
            {
                return Ok(Stopped::Deadline);
            }
            if *held >= self.replay.window {
                return Ok(Stopped::Window);
            }
            let got = channel
                .basic_get(source.as_str(), false)
                .map_err(|e| Error::from_amqp_on("queue", &source, "reading from", e))?;
            let Some(got) = got else {
                return Ok(Stopped::Drained);
            };
            let mut delivery = got.delivery;
            let message = Message::take_delivery(&mut delivery);
            self.read += 1;
            let wanted = match self.replay.filter.as_mut() {
                Some(filter) => filter(&message),
                None => true,
            };
            if !wanted {
                self.report.skipped += 1;
                *held += 1;
            } else {
                self.report.matched += 1;
                match publisher {
                    None => *held += 1,
                    Some(publisher) => {
                        // On failure the delivery stays unacknowledged: returned with the held.
                        self.move_one(publisher, message)?;
                        delivery.ack(channel).map_err(|e| {
                            Error::amqp(
                                format!(
                                    "acknowledging a replayed message on {source:?} (its copy \
                                     is out: it will be replayed again)"
                                ),
                                e,
                            )
                        })?;
                        self.report.moved += 1;
                    }
                }
            }
            let every = self.replay.progress_every;
            if every > 0 && self.read.is_multiple_of(every) {
                self.report.elapsed = self.started.elapsed();
                self.observer.replay(&ReplayEvent {
                    report: self.report,
                    finished: false,
                });
            }
        }
    }

    /// Publishes the stamped copy, mandatory and confirmed.
    fn move_one(&self, publisher: &crate::Publisher, message: Message) -> Result<()> {
        let (exchange, routing_key) = destination(
            &message,
            &self.replay.source,
            self.replay.exchange.as_deref(),
            self.replay.routing_key.as_deref(),
        )?;
        let mut copy = replayed_copy(message, &self.replay.source, self.replay.restart);
        if copy.validate().is_err() {
            // A header another client sent that cannot go back on the wire: drop it rather than
            // leave the message stuck on the queue for ever.
            copy.drop_invalid_headers();
        }
        publisher.publish(&exchange, &routing_key, copy)
    }
}

/// The copy a replay publishes: the message as received, stamped, restarted when asked.
pub(crate) fn replayed_copy(mut message: Message, source: &str, restart: bool) -> Message {
    message.received = None;
    if let Some(props) = message.properties.take() {
        // Keep the received table for the headers' AMQP types.
        message.received_headers = props.headers().clone().map(Arc::new);
    }
    let count = message
        .headers
        .get(headers::REPLAY_COUNT)
        .and_then(read_int)
        .unwrap_or(0)
        .max(0);
    message.headers.insert(
        headers::REPLAYED_FROM.into(),
        HeaderValue::Text(source.to_string()),
    );
    message.headers.insert(
        headers::REPLAYED_AT.into(),
        HeaderValue::Text(rfc3339_now()),
    );
    message.headers.insert(
        headers::REPLAY_COUNT.into(),
        HeaderValue::Int(count.saturating_add(1)),
    );
    if restart {
        message.envelope.attempt = 1;
        message.envelope.error = None;
    }
    message
}

/// Where a replayed message goes: `(exchange, routing key)`.
fn destination(
    message: &Message,
    source: &str,
    exchange: Option<&str>,
    routing_key: Option<&str>,
) -> Result<(String, String)> {
    let origin = Origin::of(message, source);
    let (exchange, default_key) = match (exchange, origin.exchange.as_deref()) {
        (Some(e), _) => (
            e.to_string(),
            origin.routing_key.clone().or(origin.queue.clone()),
        ),
        (None, Some(e)) if !e.is_empty() => (e.to_string(), origin.routing_key.clone()),
        (None, _) => (
            String::new(),
            origin.queue.clone().or(origin.routing_key.clone()),
        ),
    };
    let Some(routing_key) = routing_key.map(str::to_string).or(default_key) else {
        return Err(Error::invalid(format!(
            "message {} on {source:?} does not say where it came from; give the replay an \
             exchange and routing key",
            message.id()
        )));
    };
    if exchange.is_empty() && routing_key == source {
        return Err(Error::invalid(format!(
            "message {} would be replayed into {source:?}, the queue it is read from; give the \
             replay another exchange or routing key",
            message.id()
        )));
    }
    Ok((exchange, routing_key))
}

/// What a message says about where it was going before it was dead-lettered.
#[derive(Debug, Default)]
struct Origin {
    exchange: Option<String>,
    routing_key: Option<String>,
    queue: Option<String>,
}

impl Origin {
    fn of(message: &Message, source: &str) -> Origin {
        let text = |name: &str| message.headers.get(name).and_then(read_text);
        // This crate's consumer's copies.
        let mut origin = Origin {
            exchange: text(headers::ORIGINAL_EXCHANGE),
            routing_key: text(headers::ORIGINAL_ROUTING_KEY),
            queue: text(headers::ORIGINAL_QUEUE),
        };
        // The broker's own dead-lettering (a queue with `x-dead-letter-exchange`).
        if origin.queue.is_none() {
            origin.queue = text("x-first-death-queue");
            if origin.exchange.is_none() && origin.queue.is_some() {
                origin.exchange = text("x-first-death-exchange").or(Some(String::new()));
            }
            if origin.routing_key.is_none() {
                origin.routing_key = first_death_routing_key(message, origin.queue.as_deref());
            }
        }
        // The family's names: `orders.dlq` and `orders.parked` hold what `orders` dead-lettered.
        if origin.queue.is_none() {
            origin.queue = source
                .strip_suffix(".dlq")
                .or_else(|| source.strip_suffix(".parked"))
                .filter(|q| !q.is_empty())
                .map(str::to_string);
        }
        origin
    }
}

/// The routing key of the broker's first dead-lettering: the `x-death` entry for the first
/// death's queue (the array is most recent first, so the last such entry).
fn first_death_routing_key(message: &Message, queue: Option<&str>) -> Option<String> {
    let Some(HeaderValue::Array(deaths)) = message.headers.get("x-death") else {
        return None;
    };
    deaths
        .iter()
        .rev()
        .filter_map(|d| match d {
            HeaderValue::Table(t) => Some(t),
            _ => None,
        })
        .find(|t| queue.is_none() || t.get("queue").and_then(read_text).as_deref() == queue)
        .and_then(|t| match t.get("routing-keys") {
            Some(HeaderValue::Array(keys)) => keys.first().and_then(read_text),
            _ => None,
        })
}

fn read_text(value: &HeaderValue) -> Option<String> {
    match value {
        HeaderValue::Text(s) if !s.is_empty() => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok().filter(|s| !s.is_empty()),
        _ => None,
    }
}

fn read_int(value: &HeaderValue) -> Option<i64> {
    match value {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        // Whole and well inside i64's range once checked.
        #[allow(clippy::cast_possible_truncation)]
        HeaderValue::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18 => {
            Some(*f as i64)
        }
        _ => None,
    }
}

/// Now as RFC 3339 in UTC with whole seconds (`2026-11-30T14:12:36Z`), as the family writes
/// `acemq-replayed-at` and a slip step's `completedAt`.
pub(crate) fn rfc3339_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(headers: &[(&str, HeaderValue)]) -> Message {
        let mut m = Message::new("x");
        for (k, v) in headers {
            m.headers.insert(k.to_string(), v.clone());
        }
        m
    }

    #[test]
    fn rfc3339_has_the_family_shape() {
        let s = rfc3339_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[10] == b'T', "{s}");
    }

    #[test]
    fn the_count_is_read_forgivingly_and_incremented() {
        for (v, want) in [
            (HeaderValue::Int(2), 3),
            (HeaderValue::Text("4".into()), 5),
            (HeaderValue::Bytes(b"1".to_vec()), 2),
            (HeaderValue::Bool(true), 1),
        ] {
            let m = received(&[(headers::REPLAY_COUNT, v)]);
            let copy = replayed_copy(m, "q.dlq", true);
            assert_eq!(copy.headers[headers::REPLAY_COUNT], HeaderValue::Int(want));
        }
    }

    #[test]
    fn destinations_follow_what_the_message_says() {
        let ours = received(&[
            (
                headers::ORIGINAL_EXCHANGE,
                HeaderValue::Text("orders".into()),
            ),
            (
                headers::ORIGINAL_ROUTING_KEY,
                HeaderValue::Text("order.placed".into()),
            ),
            (headers::ORIGINAL_QUEUE, HeaderValue::Text("o".into())),
        ]);
        let d = |m: &Message, x: Option<&str>, k: Option<&str>| destination(m, "o.dlq", x, k);
        assert_eq!(
            d(&ours, None, None).unwrap(),
            ("orders".into(), "order.placed".into())
        );
        assert_eq!(
            d(&ours, Some(""), None).unwrap(),
            ("".into(), "order.placed".into())
        );
        assert_eq!(
            d(&ours, None, Some("k")).unwrap(),
            ("orders".into(), "k".into())
        );
        let direct = received(&[
            (headers::ORIGINAL_EXCHANGE, HeaderValue::Text("".into())),
            (headers::ORIGINAL_ROUTING_KEY, HeaderValue::Text("o".into())),
            (headers::ORIGINAL_QUEUE, HeaderValue::Text("o".into())),
        ]);
        assert_eq!(d(&direct, None, None).unwrap(), ("".into(), "o".into()));
        let bare = received(&[]);
        assert_eq!(d(&bare, None, None).unwrap(), ("".into(), "o".into()));
        assert!(destination(&bare, "elsewhere", None, None).is_err());
        assert!(destination(&bare, "o.dlq", Some(""), Some("o.dlq")).is_err());
    }

    #[test]
    fn broker_dead_letters_go_back_where_they_were_published() {
        let mut death = std::collections::BTreeMap::new();
        death.insert("queue".to_string(), HeaderValue::Text("work".into()));
        death.insert(
            "routing-keys".to_string(),
            HeaderValue::Array(vec![HeaderValue::Text("job.new".into())]),
        );
        let m = received(&[
            ("x-first-death-queue", HeaderValue::Text("work".into())),
            ("x-first-death-exchange", HeaderValue::Text("jobs".into())),
            (
                "x-death",
                HeaderValue::Array(vec![HeaderValue::Table(death)]),
            ),
        ]);
        assert_eq!(
            destination(&m, "dead", None, None).unwrap(),
            ("jobs".into(), "job.new".into())
        );
    }
}
