//! The outbox relay: publishes what the outbox holds, mandatory with confirms, and deletes a
//! record only after its confirm.
//!
//! ```text
//!  service transaction ──add──▶ outbox table ──pending(batch)──▶ relay ──publish──▶ broker
//!                                    ▲                              │ confirm
//!                                    └─ mark_published_and_lease ◀──┘
//! ```
//!
//! # What it guarantees
//!
//! * **Nothing is lost**: a record leaves the outbox only after the broker confirmed it. A
//!   crash or a dropped connection between the confirm and the delete publishes it again
//!   (with the same `x-acemq-id`, so an [idempotent](mod@super::idempotent) consumer ignores the
//!   second one).
//! * **Order**: records are offered oldest first and published in that order. A batch is
//!   pipelined (all of it handed to the broker, then the confirms awaited). When a record fails
//!   through its own fault (unroutable, nacked, no such exchange) the failure is counted against
//!   it; a record that failed before is published **alone**, at the head of a sweep, before
//!   anything behind it (a batch stops short of it), so the queue behind a failing record waits
//!   until it goes out or retires at `max_attempts` — except records of the very batch in which
//!   it first failed that the broker had already confirmed (sending them again would duplicate
//!   them) and, on a started relay, the batch after it: a started relay hands over the next
//!   full batch before it awaits the confirms of the one before (see below). Use
//!   [`OutboxRelayOptions::batch_size`]`(1)` for strict order (a started relay then never has
//!   two batches out at once).
//! * **Pipelined**: a started relay keeps at most two batches out — the one whose confirms it
//!   awaits and the next, handed over meanwhile — and, while the broker confirms them, deletes
//!   the batch confirmed before them and leases the next in one commit
//!   ([`OutboxStore::mark_published_and_lease`]); so a confirmed batch is deleted one batch
//!   later than it could be (a crash in between publishes it again, as any crash between a
//!   confirm and its delete does). A batch that is not full, a record that failed before and any
//!   failure end the overlap: what is out settles, what was confirmed is deleted and what was
//!   leased ahead is given back before anything more goes.
//! * **A lease is the fence**: the relay publishes, awaits and deletes a record only while it
//!   holds the record's lease, so no other relay (nor this one) leases it meanwhile. Each
//!   batch's time counts from its lease, not from its hand-over: a batch leased ahead that
//!   waited past a quarter of its lease behind slow confirms has its leases renewed
//!   ([`OutboxStore::renew`]) before it goes, or is given back and leased afresh; and when
//!   confirms are slower than half the lease (a stalled link), the leases of every record in
//!   flight — the batch awaited and the one handed over behind it — are renewed and the relay
//!   goes on waiting, up to eight times, rather than giving back records whose first copies may
//!   still reach the broker. (A store that cannot renew gives up at half the lease, as a
//!   timeout.)
//! * What is not the record's fault is not counted: a dropped connection, a channel the broker
//!   closed over another record's failure (that record's own `NotFound` is counted), a confirm
//!   that timed out. Those records' leases are ended and they go out after recovery.
//! * **Leases are given back** on every path: a record the relay leased and did not publish is
//!   offered again at once (to this relay or another), not after the lease ran out, also when
//!   the store fails mid-sweep (deleting what went out, counting a failure). A record that went
//!   out but could not be deleted stays leased and is published again after the lease.
//!
//! # Life cycle and threads
//!
//! The crate's rule (see the crate docs, "Life cycle"): configure, then start, then close.
//!
//! 1. [`OutboxRelay::new`] takes the connection, the store and [`OutboxRelayOptions`] (interval,
//!    batch size), checks the options and starts nothing. The options are fixed from then on:
//!    there is no setter on a relay, so none can be ignored.
//! 2. [`OutboxRelay::start`] consumes the relay and returns a [`RunningRelay`] with one sweeper
//!    thread (`acemq-outbox-relay`): it sweeps, and when a sweep finds less than a full batch
//!    it waits the interval (or until it is closed).
//! 3. [`RunningRelay::close`] stops the thread after its current sweep, deletes what went out,
//!    gives back what it had leased, joins the thread, closes the relay's publisher and returns
//!    a [`RelayReport`]. Dropping a [`RunningRelay`] does the same best-effort (blocking; errors
//!    are logged).
//!
//! `sweep()` publishes one batch on the caller's thread, on a relay that was never started
//! ([`OutboxRelay::sweep`]: tests, a service that flushes at the end of each request) or on a
//! running one ([`RunningRelay::sweep`]); it may be called from any thread at any time, and
//! sweeps of one relay never overlap. [`OutboxRelay::close`] closes the publisher of a relay
//! that was never started. Two relays (threads or processes) on one table are kept apart by the
//! store's leases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use serde::Serialize;

use crate::codec::{encode_with, CodecSource};
use crate::connection::Connection;
use crate::envelope::{headers, now_ms, HeaderValue, Message};
use crate::error::{Error, Result};
use crate::observe::{Observer, OutboxEvent};
use crate::patterns::outbox::{NewOutboxRecord, OutboxRecord, OutboxStore};
use crate::publish::{Publisher, PublisherOptions};

/// Encodes `payload` there and then into an outbox record: bytes, content type and the
/// envelope headers (a fresh `x-acemq-id` that stays the same however often the relay
/// publishes it, told by [`NewOutboxRecord::message_id`] so a business row can point at its
/// message). A record so made survives a deploy that changes the payload's type.
///
/// `codec` is a [`Codec`](crate::Codec), a [`Connection`] (its default codec) or a
/// [`Publisher`].
///
/// # Errors
///
/// [`Error::Codec`] when the payload cannot be encoded; validation errors for the names.
pub fn record<T: Serialize + ?Sized>(
    codec: &impl CodecSource,
    exchange: &str,
    routing_key: &str,
    payload: &T,
) -> Result<NewOutboxRecord> {
    let message = codec.with_codec(|c| -> Result<Message> {
        let body = encode_with(c, payload)?;
        Ok(Message::new(body).content_type(c.content_type()))
    })?;
    record_message(exchange, routing_key, &message)
}

/// An outbox record of a message built by hand (its id, type, correlation and headers are
/// kept; [`NewOutboxRecord::message_id`] is the message's id).
///
/// # Errors
///
/// The message's validation errors; [`Error::InvalidHeader`] for a byte-array header, which
/// the outbox's JSON `headers` column cannot hold.
pub fn record_message(
    exchange: &str,
    routing_key: &str,
    message: &Message,
) -> Result<NewOutboxRecord> {
    crate::envelope::check_name("exchange", exchange, true)?;
    crate::envelope::check_name("routing key", routing_key, true)?;
    message.validate()?;
    // The envelope as the wire will carry it (type and correlation defaults applied); the
    // origin is stamped by the relay's connection when the message has none of its own.
    let mut map = serde_json::Map::new();
    let e = &message.envelope;
    let text = |s: &str| serde_json::Value::from(s);
    map.insert(headers::ID.into(), text(&e.id));
    let message_type = e
        .message_type
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| {
            if routing_key.is_empty() {
                "message".into()
            } else {
                routing_key.into()
            }
        });
    map.insert(headers::TYPE.into(), text(&message_type));
    map.insert(headers::VERSION.into(), e.version.max(1).into());
    let correlation = e.correlation_id.as_deref().filter(|c| !c.is_empty());
    map.insert(
        headers::CORRELATION.into(),
        text(correlation.unwrap_or(&e.id)),
    );
    map.insert(headers::ATTEMPT.into(), e.attempt.max(1).into());
    map.insert(headers::FIRST_SEEN.into(), e.first_seen_ms.into());
    for (name, value) in [
        (headers::CAUSATION, &e.causation_id),
        (headers::ORIGIN, &e.origin),
        (headers::ERROR, &e.error),
        (headers::CLAIM, &e.claim),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            map.insert(name.into(), text(v));
        }
    }
    for (k, v) in message.headers.iter().chain(&message.engine_headers) {
        map.insert(k.clone(), to_json(k, v)?);
    }
    // The trace of what caused it (the handler's message), for the relay to publish later.
    if !message.headers.contains_key(headers::TRACEPARENT) {
        if let Some(current) = crate::trace::TraceContext::current() {
            map.insert(headers::TRACEPARENT.into(), text(current.traceparent()));
            if let Some(ts) = current.tracestate() {
                map.insert(headers::TRACESTATE.into(), text(ts));
            }
        }
    }
    Ok(NewOutboxRecord {
        exchange: exchange.to_string(),
        routing_key: routing_key.to_string(),
        body: message.body.clone(),
        content_type: message.content_type.clone().unwrap_or_default(),
        headers: map,
    })
}

fn to_json(name: &str, v: &HeaderValue) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match v {
        HeaderValue::Text(s) => J::String(s.clone()),
        HeaderValue::Int(i) => J::from(*i),
        HeaderValue::Bool(b) => J::Bool(*b),
        HeaderValue::Float(f) => J::from(*f),
        HeaderValue::Void => J::Null,
        HeaderValue::Timestamp(t) => J::from(*t),
        HeaderValue::Array(a) => {
            J::Array(a.iter().map(|x| to_json(name, x)).collect::<Result<_>>()?)
        }
        HeaderValue::Table(t) => J::Object(
            t.iter()
                .map(|(k, x)| Ok((k.clone(), to_json(name, x)?)))
                .collect::<Result<_>>()?,
        ),
        HeaderValue::Bytes(_) => {
            return Err(Error::InvalidHeader {
                name: name.to_string(),
                reason: "a byte-array header cannot be stored in the outbox (JSON); \
                         encode it as text"
                    .into(),
            })
        }
    })
}

fn from_json(v: serde_json::Value) -> HeaderValue {
    use serde_json::Value as J;
    match v {
        J::Null => HeaderValue::Void,
        J::Bool(b) => HeaderValue::Bool(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => HeaderValue::Int(i),
            None => HeaderValue::Float(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => HeaderValue::Text(s),
        J::Array(a) => HeaderValue::Array(a.into_iter().map(from_json).collect()),
        J::Object(o) => HeaderValue::Table(o.into_iter().map(|(k, x)| (k, from_json(x))).collect()),
    }
}

/// The message a record stands for, read with the same forgiving rules as a delivery. The
/// record's body and headers are moved into it (left empty: the relay needs only the rest of
/// the record once its message is made).
///
/// A record without a usable `x-acemq-id` (another program wrote the row: headers `{}`, an
/// empty column, an id that is not a string) is published with [`record_id`], derived from the
/// row, the same on every publish of it — so that a row published again (after its lease,
/// by another relay) is recognised downstream as the same message.
pub(crate) fn take_message(r: &mut OutboxRecord) -> Message {
    let headers = std::mem::take(&mut r.headers);
    let first_seen_given = headers.contains_key(headers::FIRST_SEEN);
    let all = headers
        .into_iter()
        .map(|(k, v)| (k, from_json(v)))
        .collect();
    // The body is moved in after the envelope is read: the derived id reads it.
    let mut m = Message::from_headers(Vec::new(), all, None, &r.routing_key, &|| record_id(r));
    m.body = std::mem::take(&mut r.body);
    if let Some(why) = m.replaced_id {
        log::warn!(
            "acemq: outbox record {} has an {} it cannot carry as it came ({why}); it is \
             published as message {}",
            r.id,
            headers::ID,
            m.envelope.id
        );
    }
    if !first_seen_given {
        m.envelope.first_seen_ms = r.created_ms;
    }
    if !r.content_type.is_empty() {
        m.content_type = Some(r.content_type.clone());
    }
    m
}

/// The id of an outbox record without a usable `x-acemq-id`: derived from what identifies the
/// row and never changes while it waits — its id, when it was added, exchange, routing key,
/// content type and body — in the UUID form (version 8) the family's readers expect. Two rows
/// alike in all of these (two tables of one database each holding a row of the same id, added
/// in the same millisecond, with the same message) are, by this rule, one message.
fn record_id(r: &OutboxRecord) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(b"acemq-outbox-record");
    field(&r.id.to_be_bytes());
    field(&r.created_ms.to_be_bytes());
    field(r.exchange.as_bytes());
    field(r.routing_key.as_bytes());
    field(r.content_type.as_bytes());
    field(&r.body);
    crate::envelope::uuid_v8(&h.finalize())
}

/// Options for an [`OutboxRelay`], fixed when it is made ([`OutboxRelay::new`]).
///
/// ```
/// use acemq_amqp::patterns::relay::OutboxRelayOptions;
/// use std::time::Duration;
/// let options = OutboxRelayOptions::new()
///     .interval(Duration::from_millis(200))
///     .batch_size(50);
/// # let _ = options;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRelayOptions {
    interval: Duration,
    batch_size: usize,
}

impl Default for OutboxRelayOptions {
    fn default() -> Self {
        OutboxRelayOptions {
            interval: Duration::from_millis(500),
            batch_size: 100,
        }
    }
}

impl OutboxRelayOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a started relay waits after a sweep that found less than a full batch before
    /// it sweeps again (a sweep that found a full batch is followed by the next one at once).
    /// Defaults to 500 ms; must not be zero (the relay would query an empty outbox without
    /// pause).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The most records one sweep leases and publishes (pipelined, then the confirms awaited).
    /// `1` publishes strictly in order, one confirm at a time. Defaults to 100; must be at
    /// least 1.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid(
                "the outbox relay's batch_size must be at least 1",
            ));
        }
        if self.interval.is_zero() {
            return Err(Error::invalid(
                "the outbox relay's interval must not be zero: it would query an empty outbox \
                 without pause",
            ));
        }
        Ok(())
    }
}

/// What a started relay did, from [`OutboxRelay::start`] to [`RunningRelay::close`]: sweeps of
/// its thread and those through [`RunningRelay::sweep`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Sweeps run, empty ones included.
    pub sweeps: u64,
    /// Of those, sweeps that ended with an error (logged, or returned by
    /// [`RunningRelay::sweep`]); their unpublished records stayed in the outbox.
    pub failed_sweeps: u64,
    /// Records the broker confirmed. A record whose delete failed afterwards is published
    /// again after its lease and then counted again.
    pub published: u64,
}

struct Core {
    connection: Connection,
    store: Arc<dyn OutboxStore>,
    options: OutboxRelayOptions,
    publisher: Mutex<Option<Publisher>>,
    /// Sweeps of one relay never overlap.
    sweeping: Mutex<()>,
    observer: Arc<dyn Observer>,
    sweeps: AtomicU64,
    failed_sweeps: AtomicU64,
    published: AtomicU64,
}

/// A batch handed to the publisher.
struct HandedOver {
    /// Records published one by one and already confirmed (indexes into the batch).
    confirmed: Vec<usize>,
    /// Pipelined publishes awaiting their confirm.
    tickets: Vec<(usize, crate::publish::Ticket)>,
    /// The records that failed, and why.
    failures: Vec<(usize, Error)>,
    /// Every record of the batch was handed over (none held back behind a failure).
    whole_batch: bool,
}

/// A batch leased ahead by a started relay (in the commit that deleted the batch before), and
/// when: its lease, and so its deadline, counts from then, not from its hand-over.
struct Leased {
    records: Vec<OutboxRecord>,
    at: Instant,
}

/// A full batch handed to the broker whose confirms the started relay awaits only after it has
/// handed over the next batch (see [`Core::pump`]).
struct InFlight {
    records: Vec<OutboxRecord>,
    handed: HandedOver,
    deadline: Instant,
}

/// Whether a failed publish is the record's own fault, counted against it: the broker refused
/// (nacked) or could not route this message, or its exchange does not exist. A lost connection
/// or channel, a timeout or a closed publisher says nothing about the record.
fn counts_against_record(e: &Error) -> bool {
    e.is_message_fault()
}

fn ids(records: &[OutboxRecord]) -> Vec<i64> {
    records.iter().map(|r| r.id).collect()
}

/// Publishes an outbox's records: configured, not running. [`sweep`](Self::sweep) it on the
/// caller's thread, or [`start`](Self::start) it. See the [module docs](self).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::relay::{OutboxRelay, OutboxRelayOptions};
/// use acemq_amqp::patterns::outbox::SqlOutboxStore;
/// use acemq_amqp::Connection;
/// use std::time::Duration;
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let store = SqlOutboxStore::builder(|| {
///     rusqlite::Connection::open("app.db")
///         .map_err(|e| acemq_amqp::Error::Sql { context: "opening".into(), source: e.into() })
/// })
/// .build()?;
/// let options = OutboxRelayOptions::new()
///     .interval(Duration::from_millis(200))
///     .batch_size(100);
/// let running = OutboxRelay::new(&connection, store, options)?.start()?;
/// // … the service runs; records added on its transactions go out …
/// let report = running.close()?;
/// println!("published {} record(s)", report.published);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub struct OutboxRelay {
    core: Arc<Core>,
}

impl std::fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("options", &self.core.options)
            .finish()
    }
}

impl OutboxRelay {
    /// A relay publishing `store`'s records on `connection` with these options. Nothing runs
    /// until [`start`](Self::start) or [`sweep`](Self::sweep); the relay's publisher is opened
    /// by its first sweep.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when a batch size or interval is zero.
    pub fn new(
        connection: &Connection,
        store: impl OutboxStore + 'static,
        options: OutboxRelayOptions,
    ) -> Result<OutboxRelay> {
        options.validate()?;
        Ok(OutboxRelay {
            core: Arc::new(Core {
                connection: connection.clone(),
                store: Arc::new(store),
                options,
                publisher: Mutex::new(None),
                sweeping: Mutex::new(()),
                observer: connection.observer().clone(),
                sweeps: AtomicU64::new(0),
                failed_sweeps: AtomicU64::new(0),
                published: AtomicU64::new(0),
            }),
        })
    }

    /// The options it was made with (and runs with).
    pub fn options(&self) -> &OutboxRelayOptions {
        &self.core.options
    }

    /// Publishes one batch now, on the caller's thread, and returns how many records went out.
    ///
    /// # Errors
    ///
    /// The store's error, else the error of the first record that failed through its own fault
    /// (for example [`Error::Unroutable`] or [`Error::Nacked`]), else the connection's; the
    /// records not published stay in the outbox and their leases are ended.
    pub fn sweep(&self) -> Result<usize> {
        self.core.sweep()
    }

    /// Starts the sweeper thread (`acemq-outbox-relay`) and returns the running relay. The
    /// report of its [`close`](RunningRelay::close) counts from here.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be spawned (the relay is then dropped, and its
    /// publisher closed).
    pub fn start(self) -> Result<RunningRelay> {
        let core = self.core;
        for counter in [&core.sweeps, &core.failed_sweeps, &core.published] {
            counter.store(0, Ordering::SeqCst);
        }
        let (stop, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let sweeper = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name("acemq-outbox-relay".into())
            .spawn(move || sweeper.run(&stop_rx))
            .map_err(|e| Error::Io {
                context: "spawning the outbox relay thread".into(),
                source: e,
            })?;
        Ok(RunningRelay {
            core,
            stop,
            thread: Some(thread),
        })
    }

    /// Closes the relay's publisher, if a sweep opened one. Dropping the relay does the same,
    /// logging the error.
    ///
    /// # Errors
    ///
    /// The publisher's close error (for example [`Error::Timeout`] for confirms still awaited).
    pub fn close(self) -> Result<()> {
        self.core.close_publisher()
    }
}

/// A started [`OutboxRelay`]: its sweeper thread runs until [`close`](Self::close).
///
/// Dropping it closes it best-effort: it **blocks** until the thread's current sweep ends (a
/// sweep publishes for at most half the store's lease, then runs its database statements), the
/// thread has deleted what went out and given back what it had leased, and the publisher is
/// closed (waiting up to its timeout for confirms still awaited); errors are logged, not
/// returned. Call [`close`](Self::close) to see them and the [`RelayReport`].
pub struct RunningRelay {
    core: Arc<Core>,
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningRelay")
            .field("options", &self.core.options)
            .field("report", &self.core.report())
            .finish()
    }
}

impl RunningRelay {
    /// The options it runs with.
    pub fn options(&self) -> &OutboxRelayOptions {
        &self.core.options
    }

    /// Publishes one batch now, on the caller's thread, between the thread's sweeps (they never
    /// overlap), and returns how many records went out: for an end-of-request flush, or a test
    /// that cannot wait for the interval. As [`OutboxRelay::sweep`].
    ///
    /// # Errors
    ///
    /// As [`OutboxRelay::sweep`].
    pub fn sweep(&self) -> Result<usize> {
        self.core.sweep()
    }

    /// Stops the sweeper thread after its current sweep (it then deletes what went out and
    /// gives back what it had leased), joins it, closes the relay's publisher and reports what
    /// the relay did since it started.
    ///
    /// # Errors
    ///
    /// The publisher's close error (for example [`Error::Timeout`] for confirms still awaited).
    /// A failure of the thread's last deletes is logged, as during the run: those records are
    /// published again after their lease.
    pub fn close(mut self) -> Result<RelayReport> {
        self.stop_thread();
        self.core.close_publisher()?;
        Ok(self.core.report())
    }

    fn stop_thread(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.stop.send(());
            if thread.join().is_err() {
                log::error!("acemq: the outbox relay thread panicked");
            }
        }
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
            if let Err(e) = self.core.close_publisher() {
                log::warn!("acemq: closing the outbox relay: {e}");
            }
        }
    }
}

impl Drop for Core {
    /// A relay dropped without `close` (never started, or its start failed) closes its
    /// publisher here.
    fn drop(&mut self) {
        if let Err(e) = self.close_publisher() {
            log::warn!("acemq: closing the outbox relay: {e}");
        }
    }
}

/// How many times the relay renews the leases of a batch whose confirms are slow to come
/// before it gives up on them (see `Core::await_confirms`): with the first half lease, a wait
/// of at most four and a half leases.
const MAX_RENEWALS: u32 = 8;

/// How often a relay working through full batches reports the backlog.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// A backlog count is asked again only this many times its last duration after it started: the
/// count (`COUNT(*)` over the table's rows not retired) takes long on a large table, and the
/// gauge may then cost the relay at most ~5 % of its time.
const BACKLOG_COST_FACTOR: u32 = 20;

impl Core {
    /// The sweeper thread: sweeps, and after a sweep that found less than a full batch waits
    /// the interval or until told to stop; stopping, it deletes what went out and gives back
    /// what it leased ahead.
    fn run(&self, stop: &Receiver<()>) {
        let (mut next, mut to_delete, mut flying): (Option<Leased>, _, _) =
            (None, Vec::new(), None);
        // When the last backlog count started, and how long it took.
        let (mut reported, mut count_took) = (Instant::now(), Duration::ZERO);
        loop {
            let full = match self.pump(&mut next, &mut to_delete, &mut flying) {
                Ok(n) => n >= self.options.batch_size,
                Err(e) => {
                    log::warn!("acemq: outbox sweep failed: {e}");
                    false
                }
            };
            if !full {
                if let Err(e) = self.flush(&mut to_delete) {
                    log::warn!("acemq: deleting published outbox records: {e}");
                }
            }
            // The backlog gauge: after a sweep that found less than a full batch, and while
            // working through a backlog at most every `BACKLOG_EVERY` (its query counts the
            // table: not a cost to pay per batch); in either case not before
            // `BACKLOG_COST_FACTOR` times the last count's duration.
            let since = reported.elapsed();
            let due = !full || since >= self.options.interval.max(BACKLOG_EVERY);
            if due && since >= count_took * BACKLOG_COST_FACTOR {
                reported = Instant::now();
                self.report_backlog();
                count_took = reported.elapsed();
            }
            let wait = if full {
                Duration::ZERO
            } else {
                self.options.interval
            };
            if !matches!(stop.recv_timeout(wait), Err(RecvTimeoutError::Timeout)) {
                // Stopping: await the batch in flight, delete what went out, give back what
                // was leased.
                if let Some(f) = flying.take() {
                    if let Err(e) = self.settle(f, &mut to_delete, None) {
                        log::warn!("acemq: outbox sweep failed: {e}");
                    }
                }
                if let Err(e) = self.flush(&mut to_delete) {
                    log::warn!("acemq: deleting published outbox records: {e}");
                }
                if let Some(leased) = next.take() {
                    self.give_back(&leased.records);
                }
                return;
            }
        }
    }

    /// Counts a sweep (of the thread or on demand) for the [`RelayReport`].
    fn count_sweep(&self, result: Result<usize>) -> Result<usize> {
        self.sweeps.fetch_add(1, Ordering::SeqCst);
        if result.is_err() {
            self.failed_sweeps.fetch_add(1, Ordering::SeqCst);
        }
        result
    }

    fn report(&self) -> RelayReport {
        RelayReport {
            sweeps: self.sweeps.load(Ordering::SeqCst),
            failed_sweeps: self.failed_sweeps.load(Ordering::SeqCst),
            published: self.published.load(Ordering::SeqCst),
        }
    }

    /// Closes the publisher a sweep opened, if any; the next sweep would open a new one.
    fn close_publisher(&self) -> Result<()> {
        match self.publisher.lock().take() {
            Some(p) => p.close(),
            None => Ok(()),
        }
    }

    fn publisher(&self) -> Result<Publisher> {
        let mut slot = self.publisher.lock();
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        // Each wait of a publish (room, recovery, its confirm) is a third of the lease at most.
        let timeout =
            (self.store.lease() / 3).clamp(Duration::from_millis(100), Duration::from_secs(10));
        let p = self.connection.publisher_with(
            PublisherOptions::new()
                // Two batches: the one in flight and the next (see `pump`).
                .window(self.options.batch_size.saturating_mul(2).max(16))
                .timeout(timeout),
        )?;
        *slot = Some(p.clone());
        Ok(p)
    }

    fn report_backlog(&self) {
        match self.store.stats() {
            Ok(stats) => self.observer.outbox(&OutboxEvent::Backlog {
                pending: stats.pending,
                oldest_age: stats.oldest_created_ms.map(|c| {
                    Duration::from_millis(u64::try_from(now_ms().saturating_sub(c)).unwrap_or(0))
                }),
            }),
            Err(e) => log::warn!("acemq: reading the outbox backlog: {e}"),
        }
    }

    /// One batch, on demand: lease, publish, delete.
    fn sweep(&self) -> Result<usize> {
        let result = self.sweep_once();
        self.count_sweep(result)
    }

    fn sweep_once(&self) -> Result<usize> {
        let _one_at_a_time = self.sweeping.lock();
        let publisher = self.publisher()?;
        let leased_at = Instant::now();
        let mut records = self.store.pending(self.options.batch_size)?;
        if records.is_empty() {
            return Ok(0);
        }
        let deadline = self.deadline(leased_at);
        let mut handed = self.hand_over(&publisher, &mut records, deadline);
        let published = self.await_confirms(&records, &mut handed, deadline, None);
        self.finish(&records, published, handed.failures)
    }

    /// When publishing a batch leased at `leased_at` (taken just before the lease statement
    /// went, so no later than the database's lease began) must be over: half the lease after
    /// it, so that the lease never runs out while this relay still publishes, awaits or has yet
    /// to delete the records (another relay would then publish them too). Counted from the
    /// lease, not from the hand-over: a batch leased ahead waits while the batch before it is
    /// confirmed.
    fn deadline(&self, leased_at: Instant) -> Instant {
        leased_at + self.store.lease() / 2
    }

    /// A batch leased ahead that waited too long to be handed over (see
    /// [`still_fresh`](Self::still_fresh)): its leases renewed, or, where the store cannot
    /// renew them all, given back and a batch leased afresh (the same records, most often).
    fn refresh(&self, l: Leased) -> Result<Leased> {
        let at = Instant::now();
        let ids = ids(&l.records);
        match self.store.renew(&ids) {
            Ok(renewed) if renewed.len() == ids.len() => {
                return Ok(Leased {
                    records: l.records,
                    at,
                })
            }
            Ok(_) => {}
            Err(e) => log::warn!("acemq: renewing the leases of outbox records: {e}"),
        }
        self.give_back(&l.records);
        let at = Instant::now();
        Ok(Leased {
            records: self.store.pending(self.options.batch_size)?,
            at,
        })
    }

    /// Whether a batch leased ahead at `leased_at` may still be handed over: while at least
    /// half of its time to publish is left (a quarter of the lease). One that waited longer
    /// behind slow confirms (a stalled link) is given back unpublished and a fresh batch
    /// leased, rather than published with too little of its lease left to be confirmed in.
    fn still_fresh(&self, leased_at: Instant) -> bool {
        leased_at.elapsed() < self.store.lease() / 4
    }

    /// The started relay's loop: like [`sweep`](Self::sweep), but pipelined. A full batch is
    /// left in flight (`flying`) while the next one is handed over; then the earlier batch's
    /// confirms are awaited, and — while the broker confirms the new one — the earlier batch is
    /// deleted and the next leased, in one commit where the store can. So the database, the
    /// publishing thread and the broker work at the same time. A batch that is not full, a
    /// record that failed before (it goes alone, after the batch in flight has settled), any
    /// failure and `batch_size(1)` (strict order) settle at once, as `sweep` does. `next`,
    /// `to_delete` and `flying` carry over between calls.
    fn pump(
        &self,
        next: &mut Option<Leased>,
        to_delete: &mut Vec<i64>,
        flying: &mut Option<InFlight>,
    ) -> Result<usize> {
        let result = self.pump_once(next, to_delete, flying);
        self.count_sweep(result)
    }

    fn pump_once(
        &self,
        next: &mut Option<Leased>,
        to_delete: &mut Vec<i64>,
        flying: &mut Option<InFlight>,
    ) -> Result<usize> {
        let _one_at_a_time = self.sweeping.lock();
        let batch_size = self.options.batch_size;
        // The publisher first, so that nothing is leased that cannot go out; on any error here
        // nothing new goes out and the batch in flight settles (what was leased ahead is given
        // back).
        let publisher_and_records = self.publisher().and_then(|p| {
            let leased = match next.take() {
                Some(l) if self.still_fresh(l.at) => l,
                Some(l) => self.refresh(l)?,
                None => {
                    let at = Instant::now();
                    Leased {
                        records: self.store.pending(batch_size)?,
                        at,
                    }
                }
            };
            Ok((p, leased))
        });
        let (
            publisher,
            Leased {
                mut records,
                at: leased_at,
            },
        ) = match publisher_and_records {
            Ok(got) => got,
            Err(e) => {
                if let Some(leased) = next.take() {
                    self.give_back(&leased.records);
                }
                if let Some(f) = flying.take() {
                    // The sweep's own error is the one returned; what settling the batch in
                    // flight ran into (a delete, a count, a lease not ended) is logged, as the
                    // relay does for every store error it cannot return.
                    if let Err(settling) = self.settle(f, to_delete, None) {
                        log::warn!(
                            "acemq: outbox sweep failed ({e}); settling the batch in flight \
                             then failed too: {settling}"
                        );
                    }
                }
                return Err(e);
            }
        };
        if records.is_empty() || records[0].attempts > 0 || batch_size == 1 {
            // Nothing to overlap with, a failed record that must go alone first, or strict
            // order: the batch in flight settles first, then this one alone. What was confirmed
            // before is deleted first: its leases are not renewed while the batch in flight is
            // awaited.
            let flushed_before = self.flush(to_delete);
            let earlier = match flying.take() {
                Some(f) => self.settle(f, to_delete, None),
                None => Ok(0),
            };
            let flushed = flushed_before.and_then(|()| self.flush(to_delete));
            if let Err(e) = earlier.and_then(|n| flushed.map(|()| n)) {
                self.give_back(&records);
                return Err(e);
            }
            let Leased {
                mut records,
                at: leased_at,
            } = if records.is_empty() || self.still_fresh(leased_at) {
                Leased {
                    records,
                    at: leased_at,
                }
            } else {
                // The batch in flight took long to settle.
                self.refresh(Leased {
                    records,
                    at: leased_at,
                })?
            };
            if records.is_empty() {
                return Ok(0);
            }
            let deadline = self.deadline(leased_at);
            let mut handed = self.hand_over(&publisher, &mut records, deadline);
            let published = self.await_confirms(&records, &mut handed, deadline, None);
            return self.finish(&records, published, handed.failures);
        }
        let mut deadline = self.deadline(leased_at);
        let mut handed = self.hand_over(&publisher, &mut records, deadline);
        let whole = handed.whole_batch && handed.failures.is_empty() && records.len() == batch_size;
        // While the broker confirms the earlier batch and this one: delete what was confirmed
        // before (the batch before the earlier one) and lease the next batch, in one commit
        // where the store can. (Measured here: awaiting the earlier batch first and committing
        // after left the broker idle during the commit; this way the two overlap.)
        let overlap = if whole {
            let at = Instant::now();
            self.store
                .mark_published_and_lease(to_delete, batch_size)
                .map(|records| {
                    to_delete.clear();
                    *next = Some(Leased { records, at });
                })
        } else {
            Ok(())
        };
        // Not full, or the commit failed: what was confirmed before is deleted now, before the
        // batch in flight is awaited (which may take half a lease and more, while the leases
        // of these confirmed records are not renewed).
        let overlap = match overlap {
            Ok(()) if whole => Ok(()),
            Ok(()) => self.flush(to_delete),
            // The commit failed: try the delete alone (what is not deleted stays in
            // `to_delete` for the next commit); the commit's error is the one reported.
            Err(e) => {
                if let Err(deleting) = self.flush(to_delete) {
                    log::warn!(
                        "acemq: deleting published outbox records after a failed commit \
                         ({e}): {deleting}; they are deleted with a later commit"
                    );
                }
                Err(e)
            }
        };
        // The earlier batch has had this batch's hand-over and the commit to be confirmed.
        let handed_ids = ids(&records);
        let earlier = match flying.take() {
            Some(f) => self.settle(f, to_delete, Some((&handed_ids, &mut deadline))),
            None => Ok(0),
        };
        // Unless this batch stays in flight, what the earlier batch had confirmed is deleted now
        // (what was leased ahead is given back below).
        let overlap = match overlap {
            Ok(()) if whole && earlier.is_ok() => Ok(()),
            Ok(()) => self.flush(to_delete),
            Err(e) => Err(e),
        };
        if whole && earlier.is_ok() && overlap.is_ok() {
            *flying = Some(InFlight {
                records,
                handed,
                deadline,
            });
            return Ok(batch_size);
        }
        // Not full, or something failed: this batch settles now, and what was leased ahead is
        // given back.
        let published = self.await_confirms(&records, &mut handed, deadline, None);
        let gave_back = match next.take() {
            Some(leased) => self.store.unlease(&ids(&leased.records)),
            None => Ok(()),
        };
        let n = self.finish(&records, published, handed.failures)?;
        earlier?;
        overlap?;
        gave_back?;
        Ok(n)
    }

    /// Awaits a batch left in flight: all confirmed → its ids join `to_delete` (deleted with the
    /// next commit); otherwise it is finished at once (deleted what went out, failures counted,
    /// leases ended).
    ///
    /// `also`: the batch handed over behind it (its ids and deadline), still in flight while
    /// this one is awaited: its leases are renewed with this batch's (see
    /// [`await_confirms`](Self::await_confirms)), so that they never run out meanwhile.
    fn settle(
        &self,
        mut f: InFlight,
        to_delete: &mut Vec<i64>,
        also: Option<(&[i64], &mut Instant)>,
    ) -> Result<usize> {
        let published = self.await_confirms(&f.records, &mut f.handed, f.deadline, also);
        if published.len() == f.records.len() && f.handed.failures.is_empty() {
            let n = published.len();
            to_delete.extend(published);
            return Ok(n);
        }
        self.finish(
            &f.records,
            published,
            std::mem::take(&mut f.handed.failures),
        )
    }

    /// Deletes what was published and confirmed.
    fn flush(&self, to_delete: &mut Vec<i64>) -> Result<()> {
        if !to_delete.is_empty() {
            self.store.mark_published_many(to_delete)?;
            to_delete.clear();
        }
        Ok(())
    }

    /// Hands the batch to the publisher: a record that failed before goes alone and is awaited
    /// first; the rest are pipelined, up to the next record that failed before (it goes alone at
    /// the head of a later sweep, so nothing behind it overtakes it).
    ///
    /// Each record handed over gives its body and headers to its message (see
    /// [`take_message`]); what the relay reads of it afterwards (id, attempts, exchange, routing
    /// key, created) stays.
    fn hand_over(
        &self,
        publisher: &Publisher,
        records: &mut [OutboxRecord],
        deadline: Instant,
    ) -> HandedOver {
        let mut handed = HandedOver {
            confirmed: Vec::new(),
            tickets: Vec::new(),
            failures: Vec::new(),
            whole_batch: false,
        };
        let mut next = 0;
        while next < records.len() && records[next].attempts > 0 {
            let r = &mut records[next];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Out of time in this sweep: the rest is given back, still in order.
                return handed;
            }
            let message = take_message(r);
            let sent = publisher
                .publish_deferred(&r.exchange, &r.routing_key, message)
                .and_then(|t| t.wait_timeout(left));
            match sent {
                Ok(()) => {
                    handed.confirmed.push(next);
                    next += 1;
                }
                Err(e) => {
                    handed.failures.push((next, e));
                    return handed;
                }
            }
        }
        for (i, r) in records.iter_mut().enumerate().skip(next) {
            if r.attempts > 0 || Instant::now() >= deadline {
                // A record that failed before waits for a later sweep; past the deadline (a
                // publish waited long for room), the rest is given back, still in order.
                return handed;
            }
            let message = take_message(r);
            match publisher.publish_deferred(&r.exchange, &r.routing_key, message) {
                Ok(t) => handed.tickets.push((i, t)),
                Err(e) => {
                    handed.failures.push((i, e));
                    return handed;
                }
            }
        }
        handed.whole_batch = true;
        handed
    }

    /// Waits for the confirms; returns the ids the broker took, in order.
    ///
    /// At the deadline (half the lease) with confirms still to come — a stalled link — the
    /// leases of the records still awaited are renewed ([`OutboxStore::renew`], only those this
    /// store still holds) and the relay goes on waiting for them, up to `MAX_RENEWALS` times:
    /// giving them back instead would have them published again while the first copies may
    /// still reach the broker. A record whose lease could not be renewed is given up on (a
    /// timeout, not its fault: its lease is ended and it goes out again). The records already
    /// confirmed are renewed with them (they are deleted once the batch settles). The leases of `also`
    /// (another batch in flight meanwhile) are renewed with them, and its deadline moved when
    /// they all were.
    fn await_confirms(
        &self,
        records: &[OutboxRecord],
        handed: &mut HandedOver,
        deadline: Instant,
        mut also: Option<(&[i64], &mut Instant)>,
    ) -> Vec<i64> {
        let mut published = Vec::with_capacity(records.len());
        for i in std::mem::take(&mut handed.confirmed) {
            self.published(&records[i]);
            published.push(records[i].id);
        }
        let (mut deadline, mut renewals, started) = (deadline, 0, Instant::now());
        let mut waiting: std::collections::VecDeque<_> = std::mem::take(&mut handed.tickets).into();
        while let Some((i, ticket)) = waiting.pop_front() {
            let ticket = match ticket.wait_or_keep(deadline) {
                Ok(Ok(())) => {
                    self.published(&records[i]);
                    published.push(records[i].id);
                    continue;
                }
                Ok(Err(e)) => {
                    handed.failures.push((i, e));
                    continue;
                }
                Err(ticket) => ticket,
            };
            waiting.push_front((i, ticket));
            // The records still awaited, those of the batch already confirmed (they are
            // deleted only after it settles) and the other batch in flight.
            let mut ids: Vec<i64> = waiting.iter().map(|(i, _)| records[*i].id).collect();
            ids.extend_from_slice(&published);
            if let Some((other, _)) = &also {
                ids.extend_from_slice(other);
            }
            let renewed_at = Instant::now();
            let renewed = if renewals < MAX_RENEWALS {
                self.store.renew(&ids).unwrap_or_else(|e| {
                    log::warn!("acemq: renewing the leases of outbox records in flight: {e}");
                    Vec::new()
                })
            } else {
                Vec::new()
            };
            renewals += 1;
            let (kept, lost): (Vec<_>, Vec<_>) = waiting
                .drain(..)
                .partition(|(i, _)| renewed.contains(&records[*i].id));
            for (i, _) in lost {
                handed.failures.push((
                    i,
                    Error::Timeout {
                        what: format!("the confirm of outbox record {}", records[i].id),
                        after: started.elapsed(),
                    },
                ));
            }
            if !kept.is_empty() {
                log::warn!(
                    "acemq: {} outbox record(s) in flight not confirmed within half their \
                     lease; their leases renewed, the relay goes on waiting",
                    kept.len()
                );
            }
            waiting = kept.into();
            deadline = self.deadline(renewed_at);
            if let Some((other, other_deadline)) = &mut also {
                if other.iter().all(|id| renewed.contains(id)) {
                    **other_deadline = deadline;
                }
            }
        }
        published
    }

    /// Deletes what went out, counts each failure that was its record's own fault (which ends
    /// that record's lease) and ends every other lease of the batch, carrying on past a store
    /// error so that no record the relay did not publish is left leased. Returns the store's
    /// first error, else the first failure counted, else the first failure.
    fn finish(
        &self,
        records: &[OutboxRecord],
        published: Vec<i64>,
        mut failures: Vec<(usize, Error)>,
    ) -> Result<usize> {
        // Delete what went out before anything else: a failure below must not lose that.
        let mut store_error = if published.is_empty() {
            None
        } else {
            self.store.mark_published_many(&published).err()
        };
        failures.sort_by_key(|(at, _)| *at);
        let (mut counted, mut first_counted, mut first_other) = (Vec::new(), None, None);
        for (at, e) in failures {
            let r = &records[at];
            if !counts_against_record(&e) {
                log::warn!(
                    "acemq: outbox record {} not published ({e}); it stays in the outbox",
                    r.id
                );
                first_other = first_other.or(Some(e));
                continue;
            }
            let error = e.to_string();
            match self.store.record_failure(r.id, &error) {
                Ok(()) => {
                    counted.push(r.id);
                    self.observer.outbox(&OutboxEvent::Failed {
                        id: r.id,
                        attempts: r.attempts + 1,
                        error: &error,
                    });
                }
                Err(se) => store_error = store_error.or(Some(se)),
            }
            first_counted = first_counted.or(Some(e));
        }
        let unpublished: Vec<i64> = ids(records)
            .into_iter()
            .filter(|id| !published.contains(id) && !counted.contains(id))
            .collect();
        if !unpublished.is_empty() {
            if let Err(e) = self.store.unlease(&unpublished) {
                store_error = store_error.or(Some(e));
            }
        }
        match store_error.or(first_counted).or(first_other) {
            Some(e) => Err(e),
            None => Ok(published.len()),
        }
    }

    /// Ends the leases on records the relay will not publish now, when it is giving up on an
    /// error of its own (which it reports): a failure to do so is only logged.
    fn give_back(&self, records: &[OutboxRecord]) {
        if records.is_empty() {
            return;
        }
        if let Err(e) = self.store.unlease(&ids(records)) {
            log::warn!("acemq: ending outbox leases: {e}");
        }
    }

    fn published(&self, r: &OutboxRecord) {
        self.published.fetch_add(1, Ordering::SeqCst);
        let lag = Duration::from_millis(
            u64::try_from(now_ms().saturating_sub(r.created_ms)).unwrap_or(0),
        );
        self.observer.outbox(&OutboxEvent::Published {
            id: r.id,
            exchange: &r.exchange,
            routing_key: &r.routing_key,
            lag,
        });
    }
}
