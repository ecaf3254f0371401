//! The benchmark suite: every figure in one process, raw amiquip (TCP_NODELAY) and the library
//! alternating in the same run, several rounds, medians.
//!
//! ```text
//! cargo run --release --all-features --example bench -- [--quick] [--json]
//! ```
//!
//! Each row: figure, unit, ours, raw, ratio, target, met, and the peak RSS of the process while
//! the figure ran (VmHWM, reset before each figure through `/proc/self/clear_refs`). `--json`
//! prints one JSON object per row instead of the table. `--quick` uses small counts and fewer
//! rounds (under a minute; for CI, which reports and never fails on a ratio); the full run takes
//! a few minutes. The machine is shared: the load average is printed with the figures.
//!
//! Services: RabbitMQ at `ACEMQ_AMQP_URL` or 127.0.0.1:5672 (guest; raw amiquip dials the same), PostgreSQL at `PG_URL` or
//! `host=127.0.0.1 user=postgres dbname=test`, MySQL/MariaDB at `MYSQL_URL` or
//! `mysql://root@127.0.0.1:3306/test`. SQLite files go to a temporary directory (WAL,
//! `synchronous=FULL`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::fuzzing::to_amiquip_properties;
use acemq_amqp::observe::Observer;
use acemq_amqp::observe::OutboxEvent;
use acemq_amqp::patterns::acknowledged::{
    consume, Acknowledge, AmqpAcknowledge, AmqpQueue, AmqpQueueOptions, AmqpToken, Batcher,
    BatcherOptions, CounterIncrement, CounterStore, CounterStoreOptions, Delivery, IterSource,
};
use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{
    idempotent, idempotent_tx, IdempotentOptions, IdempotentTxBatchOptions,
};
use acemq_amqp::patterns::ordering::{by_header, ordered};
use acemq_amqp::patterns::outbox::{
    record, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions, OutboxStore, SqlOutboxStore,
    SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions, RunningRequester,
};
use acemq_amqp::sql::{
    checkout, CheckIdle, MysqlManager, PostgresConnectionManager, Sql, SqliteManager, Transactional,
};
use acemq_amqp::StopHandle;
use acemq_amqp::{
    BoxError, Connection, ConsumerOptions, Error, Handler, JsonCodec, Message, Outcome,
    PublisherOptions, QueueSpec, Result,
};
use amiquip::{AmqpProperties, ConsumerMessage, ConsumerOptions as RawConsumerOptions, Publish};

#[path = "common/mod.rs"]
mod common;
#[path = "common/fail.rs"]
mod fail;

const BODY: [u8; 200] = [b'x'; 200];

/// The heap, counted while a memory figure asks for it: what RSS cannot show once the process
/// holds freed pages from earlier figures (a peak RSS growth of 0 says nothing).
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

    pub struct Counting;

    static ON: AtomicBool = AtomicBool::new(false);
    static LIVE: AtomicIsize = AtomicIsize::new(0);
    static PEAK: AtomicIsize = AtomicIsize::new(0);

    // SAFETY: every call is passed on to the system allocator unchanged; the counting only
    // reads and updates atomics.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() && ON.load(Ordering::Relaxed) {
                let size = isize::try_from(layout.size()).unwrap_or(isize::MAX);
                let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
                PEAK.fetch_max(live, Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if ON.load(Ordering::Relaxed) {
                let size = isize::try_from(layout.size()).unwrap_or(isize::MAX);
                LIVE.fetch_sub(size, Ordering::Relaxed);
            }
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Starts counting from zero: allocations minus frees from now on (a free of something
    /// allocated before counts too, so the figure is the growth, never more).
    pub fn start() {
        LIVE.store(0, Ordering::Relaxed);
        PEAK.store(0, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
    }

    /// Stops counting; the peak growth since [`start`], in MiB.
    pub fn stop_peak_mib() -> f64 {
        ON.store(false, Ordering::Relaxed);
        PEAK.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
    }
}

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

// ---------------------------------------------------------------------------------------------
// Rows

#[derive(Clone, Copy)]
enum Target {
    None,
    /// ours / raw at least this.
    RatioAtLeast(f64),
    /// ours at most this (memory in MiB, a latency in ms).
    AtMost(f64),
}

struct Row {
    figure: String,
    unit: &'static str,
    ours: Option<f64>,
    raw: Option<f64>,
    target: Target,
    rss_mib: f64,
    note: String,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        Some(self.ours? / self.raw?)
    }
    fn met(&self) -> Option<bool> {
        match self.target {
            Target::None => None,
            Target::RatioAtLeast(t) => self.ratio().map(|r| r >= t),
            Target::AtMost(t) => self.ours.map(|o| o <= t),
        }
    }
    fn target_text(&self) -> String {
        match self.target {
            Target::None => "-".into(),
            Target::RatioAtLeast(t) => format!("≥ {t:.2}×"),
            Target::AtMost(t) => format!("≤ {t}"),
        }
    }
    fn json(&self, load: &str) -> String {
        serde_json::json!({
            "figure": self.figure,
            "unit": self.unit,
            "ours": self.ours,
            "raw": self.raw,
            "ratio": self.ratio().map(|r| (r * 1000.0).round() / 1000.0),
            "target": self.target_text(),
            "met": self.met(),
            "peak_rss_mib": (self.rss_mib * 10.0).round() / 10.0,
            "note": self.note,
            "load": load,
        })
        .to_string()
    }
}

struct Suite {
    quick: bool,
    json: bool,
    rounds: usize,
    rows: Vec<Row>,
}

impl Suite {
    /// `n` in a full run, `n / 10` (at least `min`) in a quick one.
    fn n(&self, full: usize, min: usize) -> usize {
        if self.quick {
            (full / 10).max(min)
        } else {
            full
        }
    }

    fn push(&mut self, row: Row) {
        if !self.json {
            print_row(&row);
        }
        self.rows.push(row);
    }

    /// Runs `f` (which pushes rows) with the peak RSS reset before it; sets the rows' RSS.
    fn figure(&mut self, f: impl FnOnce(&mut Suite) -> Result<()>) -> Result<()> {
        reset_peak_rss();
        let first = self.rows.len();
        let json = self.json;
        self.json = true; // print after the RSS is known
        let r = f(self);
        self.json = json;
        let peak = peak_rss_mib();
        for row in &mut self.rows[first..] {
            row.rss_mib = peak;
            if !json {
                print_row(row);
            }
        }
        r
    }
}

fn print_row(row: &Row) {
    // Rates as whole numbers; small figures (a latency in ms) with two decimals.
    let f = |v: Option<f64>| {
        v.map_or("-".to_string(), |v| {
            if v.abs() < 10.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.0}")
            }
        })
    };
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
        row.figure,
        row.unit,
        f(row.ours),
        f(row.raw),
        row.ratio().map_or("-".into(), |r| format!("{r:.2}×")),
        row.target_text(),
        match row.met() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        },
        row.rss_mib,
        row.note
    );
}

fn reset_peak_rss() {
    // Linux: writing 5 resets the peak resident set size (VmHWM) to the current one.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

fn peak_rss_mib() -> f64 {
    status_kib("VmHWM:") / 1024.0
}

fn rss_mib() -> f64 {
    status_kib("VmRSS:") / 1024.0
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Publishing

/// Raw amiquip publishing `n` in windows of `window` confirms; with `envelope`, the envelope
/// headers acemq writes built **per message** (a fresh id, the header table), as a raw user
/// carrying the family's contract would.
fn raw_publish(queue: &str, n: usize, window: usize, envelope: bool) -> Duration {
    use amiquip::{Confirm, ConfirmSmoother};
    let mut conn = common::raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    let confirms = ch.listen_for_publisher_confirms().expect("confirms");
    ch.enable_publisher_confirms().expect("confirm mode");
    let mut smoother = ConfirmSmoother::new();
    let bare = AmqpProperties::default().with_delivery_mode(2);
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let batch = window.min(n - sent);
        for _ in 0..batch {
            let props = if envelope {
                to_amiquip_properties(
                    Message::new(&BODY[..]).to_properties_for_bench(queue, "acemq@bench"),
                )
            } else {
                bare.clone()
            };
            ch.basic_publish("", Publish::with_properties(&BODY, queue, props))
                .expect("publish");
        }
        let mut acked = 0;
        while acked < batch {
            for c in smoother.process(confirms.recv().expect("confirm")) {
                assert!(matches!(c, Confirm::Ack(_)));
                acked += 1;
            }
        }
        sent += batch;
    }
    let took = start.elapsed();
    conn.close().expect("close");
    took
}

/// Raw amiquip without confirms: `n` publishes, then one round trip (`basic.qos`) on the same
/// channel, so the time ends when the broker has read them all, as ours does (`close`).
fn raw_publish_unconfirmed(queue: &str, n: usize, envelope: bool) -> Duration {
    let mut conn = common::raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    let bare = AmqpProperties::default().with_delivery_mode(2);
    let start = Instant::now();
    for _ in 0..n {
        let props = if envelope {
            to_amiquip_properties(
                Message::new(&BODY[..]).to_properties_for_bench(queue, "acemq@bench"),
            )
        } else {
            bare.clone()
        };
        ch.basic_publish("", Publish::with_properties(&BODY, queue, props))
            .expect("publish");
    }
    ch.qos(0, 0, false).expect("round trip");
    let took = start.elapsed();
    conn.close().expect("close");
    took
}

/// Ours without confirms (`PublisherOptions::confirms(false)`): `n` publishes, then `close`,
/// which returns once a round trip shows the broker read them all.
fn our_publish_unconfirmed(conn: &Connection, queue: &str, n: usize) -> Result<Duration> {
    let publisher = conn.publisher_with(PublisherOptions::new().confirms(false))?;
    let start = Instant::now();
    for _ in 0..n {
        publisher.publish("", queue, Message::new(&BODY[..]))?;
    }
    publisher.close()?;
    Ok(start.elapsed())
}

fn our_publish(conn: &Connection, queue: &str, n: usize, window: usize) -> Result<Duration> {
    let publisher = conn.publisher_with(PublisherOptions::new().window(window.max(1)))?;
    let start = Instant::now();
    let mut sent = 0;
    let mut tickets = Vec::with_capacity(window);
    while sent < n {
        let batch = window.min(n - sent);
        if batch == 1 {
            publisher.publish("", queue, Message::new(&BODY[..]))?;
        } else {
            for _ in 0..batch {
                tickets.push(publisher.publish_deferred("", queue, Message::new(&BODY[..]))?);
            }
            for t in tickets.drain(..) {
                t.wait()?;
            }
        }
        sent += batch;
    }
    let took = start.elapsed();
    publisher.close()?;
    Ok(took)
}

/// [`our_publish`] with each window one `publish_all` batch: handed over together, the
/// confirms awaited once, a report per message.
fn our_publish_all(conn: &Connection, queue: &str, n: usize, batch: usize) -> Result<Duration> {
    let publisher = conn.publisher_with(PublisherOptions::new().window(batch.max(1)))?;
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let size = batch.min(n - sent);
        let report =
            publisher.publish_all((0..size).map(|_| ("", queue, Message::new(&BODY[..]))))?;
        assert_eq!(report.confirmed(), size);
        sent += size;
    }
    let took = start.elapsed();
    publisher.close()?;
    Ok(took)
}

fn publishing(s: &mut Suite, conn: &Connection) -> Result<()> {
    let queue = format!("bench.publish.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    for (name, n, window) in [
        ("publish, confirm per message", s.n(1_000, 200), 1usize),
        ("publish, windows of 100", s.n(20_000, 4_000), 100),
    ] {
        let (mut bare, mut env, mut ours) = (vec![], vec![], vec![]);
        for _ in 0..s.rounds {
            conn.purge_queue(&queue)?;
            bare.push(rate(n, raw_publish(&queue, n, window, false)));
            conn.purge_queue(&queue)?;
            env.push(rate(n, raw_publish(&queue, n, window, true)));
            conn.purge_queue(&queue)?;
            ours.push(rate(n, our_publish(conn, &queue, n, window)?));
        }
        let ours = median(ours);
        s.push(Row {
            figure: format!("{name} vs raw"),
            unit: "msg/s",
            ours: Some(ours),
            raw: Some(median(bare)),
            target: Target::None,
            rss_mib: 0.0,
            note: format!("{n} × 200 B persistent"),
        });
        s.push(Row {
            figure: format!("{name} vs raw+env"),
            unit: "msg/s",
            ours: Some(ours),
            raw: Some(median(env)),
            target: if window == 1 {
                Target::None
            } else {
                Target::RatioAtLeast(0.95)
            },
            rss_mib: 0.0,
            note: "raw builds the envelope headers per message".into(),
        });
    }
    // Without confirms (at most once), both sides ending with one round trip.
    let n = s.n(20_000, 4_000);
    let (mut bare, mut env, mut ours) = (vec![], vec![], vec![]);
    for _ in 0..s.rounds {
        conn.purge_queue(&queue)?;
        bare.push(rate(n, raw_publish_unconfirmed(&queue, n, false)));
        conn.purge_queue(&queue)?;
        env.push(rate(n, raw_publish_unconfirmed(&queue, n, true)));
        conn.purge_queue(&queue)?;
        ours.push(rate(n, our_publish_unconfirmed(conn, &queue, n)?));
    }
    let ours = median(ours);
    s.push(Row {
        figure: "publish unconfirmed vs raw".into(),
        unit: "msg/s",
        ours: Some(ours),
        raw: Some(median(bare)),
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "{n} × 200 B persistent, no confirms; both end with a round trip (the broker read \
             them all)"
        ),
    });
    s.push(Row {
        figure: "publish unconfirmed vs raw+env".into(),
        unit: "msg/s",
        ours: Some(ours),
        raw: Some(median(env)),
        target: Target::None,
        rss_mib: 0.0,
        note: "raw builds the envelope headers per message; ours bounded by the window and \
               byte budget, raw's buffer unbounded"
            .into(),
    });
    // Beside the windowed `publish_deferred` row: the same windows, each one `publish_all`.
    let (n, batch) = (s.n(20_000, 4_000), 100);
    let (mut env, mut ours) = (vec![], vec![]);
    for _ in 0..s.rounds {
        conn.purge_queue(&queue)?;
        env.push(rate(n, raw_publish(&queue, n, batch, true)));
        conn.purge_queue(&queue)?;
        ours.push(rate(n, our_publish_all(conn, &queue, n, batch)?));
    }
    s.push(Row {
        figure: format!("publish_all, batches of {batch} vs raw+env"),
        unit: "msg/s",
        ours: Some(median(ours)),
        raw: Some(median(env)),
        target: Target::RatioAtLeast(0.95),
        rss_mib: 0.0,
        note: format!("{n} × 200 B persistent; one report per batch"),
    });
    conn.purge_queue(&queue)?;
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Consuming

/// Counts accepted messages and says when `n` were; forwards batching to the handler.
struct Counted<H> {
    handler: H,
    count: AtomicUsize,
    n: usize,
    done: crossbeam_channel::Sender<Instant>,
}

impl<H> Counted<H> {
    fn count(&self, r: &acemq_amqp::HandlerResult) {
        if matches!(r, Ok(Outcome::Accept))
            && self.count.fetch_add(1, Ordering::Relaxed) + 1 == self.n
        {
            let _ = self.done.try_send(Instant::now());
        }
    }
}

impl<H: Handler> Handler for Counted<H> {
    fn handle(&self, m: &Message) -> acemq_amqp::HandlerResult {
        let r = self.handler.handle(m);
        self.count(&r);
        r
    }
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }
    fn handle_batch(&self, ms: &[&Message]) -> Vec<std::thread::Result<acemq_amqp::HandlerResult>> {
        let results = self.handler.handle_batch(ms);
        for r in results.iter().flatten() {
            self.count(r);
        }
        results
    }
}

/// Runs a consumer with `handler` until `n` messages were handled; the time it took.
fn our_consume(
    conn: &Connection,
    queue: &str,
    n: usize,
    options: ConsumerOptions,
    handler: impl Handler + Send + Sync + 'static,
) -> Result<Duration> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let start = Instant::now();
    let consumer = conn
        .consumer(queue, options.declare(false))?
        .start(Counted {
            handler,
            count: AtomicUsize::new(0),
            n,
            done: tx,
        })?;
    let end = rx
        .recv_timeout(Duration::from_secs(600))
        .map_err(|_| Error::Closed { what: "bench" })?;
    consumer.close()?;
    Ok(end - start)
}

fn fill(conn: &Connection, queue: &str, n: usize) -> Result<()> {
    common::fill_queue(conn, queue, n, |_| BODY.to_vec())
}

fn consuming(s: &mut Suite, conn: &Connection) -> Result<()> {
    let queue = format!("bench.consume.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(20_000, 5_000);
    let (mut raw, mut one, mut eight) = (vec![], vec![], vec![]);
    for _ in 0..s.rounds {
        fill(conn, &queue, n)?;
        raw.push(rate(n, common::raw_consume(&queue, n, 100)));
        for (c, v) in [(1, &mut one), (8, &mut eight)] {
            fill(conn, &queue, n)?;
            let opts = ConsumerOptions::new().prefetch(100).concurrency(c);
            v.push(rate(
                n,
                our_consume(conn, &queue, n, opts, |_: &Message| Ok(Outcome::Accept))?,
            ));
        }
    }
    let raw = median(raw);
    for (c, v) in [(1, one), (8, eight)] {
        s.push(Row {
            figure: format!("consume + ack, concurrency {c}"),
            unit: "msg/s",
            ours: Some(median(v)),
            raw: Some(raw),
            target: Target::None,
            rss_mib: 0.0,
            note: format!("{n} × 200 B, prefetch 100"),
        });
    }
    conn.delete_queue(&queue)?;
    Ok(())
}

/// Publishing and consuming through the in-process broker (`memory://`, what a user's tests run
/// on) beside raw amiquip on RabbitMQ: what the library costs without a socket, and how much
/// faster a test on `memory://` is than one on the real broker.
fn in_process(s: &mut Suite) -> Result<()> {
    let queue = format!("bench.inproc.{}", std::process::id());
    let memory = Connection::open(&format!("memory://bench-{}", std::process::id()))?;
    let rabbit = Connection::open(&common::amqp_url())?;
    memory.declare_queue(&QueueSpec::new(&queue).classic())?;
    rabbit.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(20_000, 5_000);
    let (mut raw_pub, mut raw_con, mut mem_pub, mut mem_con) = (vec![], vec![], vec![], vec![]);
    for _ in 0..s.rounds {
        rabbit.purge_queue(&queue)?;
        raw_pub.push(rate(n, raw_publish(&queue, n, 100, false)));
        raw_con.push(rate(n, common::raw_consume(&queue, n, 100)));
        memory.purge_queue(&queue)?;
        mem_pub.push(rate(n, our_publish(&memory, &queue, n, 100)?));
        let opts = ConsumerOptions::new().prefetch(100).concurrency(1);
        mem_con.push(rate(
            n,
            our_consume(&memory, &queue, n, opts, |_: &Message| Ok(Outcome::Accept))?,
        ));
    }
    for (figure, ours, raw) in [
        (
            "publish, windows of 100, through memory://",
            mem_pub,
            raw_pub,
        ),
        (
            "consume + ack through memory://, concurrency 1",
            mem_con,
            raw_con,
        ),
    ] {
        s.push(Row {
            figure: figure.into(),
            unit: "msg/s",
            ours: Some(median(ours)),
            raw: Some(median(raw)),
            target: Target::None,
            rss_mib: 0.0,
            note: format!("{n} × 200 B; raw is amiquip on RabbitMQ"),
        });
    }
    memory.delete_queue(&queue)?;
    rabbit.delete_queue(&queue)?;
    memory.close()?;
    rabbit.close()
}

// ---------------------------------------------------------------------------------------------
// Databases

fn sql_err(context: &str, e: impl Into<BoxError>) -> Error {
    Error::Sql {
        context: context.into(),
        source: e.into(),
    }
}

fn pg_url() -> String {
    std::env::var("PG_URL").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

fn sqlite_pool(path: &std::path::Path, size: u32) -> Result<r2d2::Pool<SqliteManager>> {
    let manager = SqliteManager::file(path).init(|c| {
        c.busy_timeout(Duration::from_secs(30))?;
        c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;")
    });
    Ok(r2d2::Pool::builder().max_size(size).build(manager)?)
}

/// A PostgreSQL pool as the crate recommends it: r2d2's health check on checkout (on by
/// default) only for connections idle past `CheckIdle`'s window.
fn pg_pool(size: u32) -> Result<r2d2::Pool<CheckIdle<PostgresConnectionManager<postgres::NoTls>>>> {
    let config: postgres::Config = pg_url().parse()?;
    Ok(r2d2::Pool::builder().max_size(size).build(CheckIdle::new(
        PostgresConnectionManager::new(config, postgres::NoTls),
    ))?)
}

fn my_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A MySQL pool as the crate recommends it: `MysqlManager` under `CheckIdle`.
fn my_pool(size: u32) -> Result<r2d2::Pool<CheckIdle<MysqlManager>>> {
    Ok(r2d2::Pool::builder()
        .max_size(size)
        .build(CheckIdle::new(MysqlManager::from_url(&my_url())?))?)
}

fn drop_my_tables(tables: &[String]) -> Result<()> {
    let pool = my_pool(1)?;
    let mut c = pool.get()?;
    for t in tables {
        c.execute(&format!("DROP TABLE IF EXISTS {t}"), &[])?;
    }
    Ok(())
}

fn drop_pg_tables(tables: &[String]) -> Result<()> {
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    for t in tables {
        c.batch_execute(&format!("DROP TABLE IF EXISTS {t}"))?;
    }
    Ok(())
}

/// Which idempotent consumer a row measures.
#[derive(Clone, Copy, PartialEq)]
enum Idem {
    /// The plain wrapper at concurrency 32: its claims and confirms group across workers, so
    /// the workers set the group size.
    Plain,
    /// The plain wrapper at concurrency 8.
    Plain8,
    Tx,
    TxBatched,
}

impl Idem {
    fn name(self) -> &'static str {
        match self {
            Idem::Plain => "idempotent, concurrency 32,",
            Idem::Plain8 => "idempotent, concurrency 8,",
            Idem::Tx => "idempotent_tx",
            Idem::TxBatched => "idempotent_tx batch 100",
        }
    }
    fn options(self) -> ConsumerOptions {
        match self {
            Idem::Plain => ConsumerOptions::new().prefetch(100).concurrency(32),
            Idem::Plain8 => ConsumerOptions::new().prefetch(100).concurrency(8),
            Idem::Tx => ConsumerOptions::new().prefetch(100).concurrency(1),
            Idem::TxBatched => ConsumerOptions::new().prefetch(200).concurrency(1),
        }
    }
}

const BATCH: usize = 100;
const BATCH_WAIT: Duration = Duration::from_millis(20);

/// One idempotent consumer over `pool` (SQLite or PostgreSQL): its rate on `n` messages.
fn idem_rate<M>(
    conn: &Connection,
    queue: &str,
    n: usize,
    kind: Idem,
    pool: &r2d2::Pool<M>,
    table: &str,
) -> Result<f64>
where
    M: r2d2::ManageConnection,
    M::Connection: Sql + acemq_amqp::sql::Transactional,
{
    let store = SqlIdempotencyStore::open(
        checkout(pool),
        SqlIdempotencyStoreOptions::default()
            .table(table)
            .group_commit(matches!(kind, Idem::Plain | Idem::Plain8)),
    )?;
    store.create_table()?;
    let store = Arc::new(store);
    let d = match kind {
        Idem::Plain | Idem::Plain8 => our_consume(
            conn,
            queue,
            n,
            kind.options(),
            idempotent(
                store,
                |_: &Message| Ok(Outcome::Accept),
                IdempotentOptions::default(),
            ),
        )?,
        Idem::Tx | Idem::TxBatched => {
            let h = idempotent_tx(
                store,
                checkout(pool),
                |_: &Message, _: &mut _| Ok(Outcome::Accept),
                IdempotentOptions::default(),
            );
            let h = h.batch(
                IdempotentTxBatchOptions::default()
                    .max_messages(if kind == Idem::Tx { 1 } else { BATCH })
                    .max_wait(BATCH_WAIT),
            )?;
            our_consume(conn, queue, n, kind.options(), h)?
        }
    };
    Ok(rate(n, d))
}

fn idempotency(s: &mut Suite, conn: &Connection, dir: &std::path::Path) -> Result<()> {
    let run = std::process::id();
    let queue = format!("bench.idem.{run}");
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(10_000, 2_000);
    // The one-transaction-per-message form is slow: fewer messages.
    let n_tx = s.n(2_000, 200);
    let kinds = [Idem::Plain, Idem::Plain8, Idem::Tx, Idem::TxBatched];
    let mut raw = vec![];
    let mut lite: Vec<Vec<f64>> = vec![vec![]; kinds.len()];
    let mut post: Vec<Vec<f64>> = vec![vec![]; kinds.len()];
    let mut mine: Vec<Vec<f64>> = vec![vec![]; kinds.len()];
    let mut pg_tables = vec![];
    let mut my_tables = vec![];
    for round in 0..s.rounds {
        fill(conn, &queue, n)?;
        raw.push(rate(n, common::raw_consume(&queue, n, 100)));
        for (i, kind) in kinds.into_iter().enumerate() {
            let n = if kind == Idem::Tx { n_tx } else { n };
            fill(conn, &queue, n)?;
            let path = dir.join(format!("idem-{i}-{round}.db"));
            lite[i].push(idem_rate(
                conn,
                &queue,
                n,
                kind,
                &sqlite_pool(&path, 8)?,
                "idem",
            )?);
            fill(conn, &queue, n)?;
            let table = format!("bench_idem_{run}_{i}_{round}");
            pg_tables.push(table.clone());
            post[i].push(idem_rate(conn, &queue, n, kind, &pg_pool(8)?, &table)?);
            fill(conn, &queue, n)?;
            let table = format!("bench_idem_my_{run}_{i}_{round}");
            my_tables.push(table.clone());
            mine[i].push(idem_rate(conn, &queue, n, kind, &my_pool(8)?, &table)?);
        }
    }
    drop_pg_tables(&pg_tables)?;
    drop_my_tables(&my_tables)?;
    let raw = median(raw);
    for (db, figures) in [("SQLite FULL", lite), ("PostgreSQL", post), ("MySQL", mine)] {
        for (kind, v) in kinds.into_iter().zip(figures) {
            let target = match (kind, db) {
                // Not measured enough here yet to set one.
                (_, "MySQL") => Target::None,
                (Idem::Plain, _) => Target::RatioAtLeast(0.25),
                (Idem::TxBatched, "SQLite FULL") => Target::RatioAtLeast(0.5),
                (Idem::TxBatched, _) => Target::RatioAtLeast(0.3),
                _ => Target::None,
            };
            s.push(Row {
                figure: format!("{} on {db} vs consume + ack", kind.name()),
                unit: "msg/s",
                ours: Some(median(v)),
                raw: Some(raw),
                target,
                rss_mib: 0.0,
                note: format!(
                    "{} msgs, {}",
                    if kind == Idem::Tx { n_tx } else { n },
                    match kind {
                        Idem::Plain => "prefetch 100, concurrency 32, store group_commit",
                        Idem::Plain8 => "prefetch 100, concurrency 8, store group_commit",
                        Idem::Tx => "prefetch 100, concurrency 1",
                        Idem::TxBatched => "prefetch 200, concurrency 1",
                    }
                ),
            });
        }
    }
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The outbox relay

/// Says when `n` records were reported published.
struct Published {
    count: AtomicUsize,
    n: usize,
    done: crossbeam_channel::Sender<Instant>,
}

impl Observer for Published {
    fn outbox(&self, event: &OutboxEvent<'_>) {
        if let OutboxEvent::Published { .. } = event {
            if self.count.fetch_add(1, Ordering::Relaxed) + 1 == self.n {
                let _ = self.done.try_send(Instant::now());
            }
        }
    }
}

fn relay_rate(store: impl OutboxStore + 'static, n: usize) -> Result<f64> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let connection = acemq_amqp::Connection::open_with(
        acemq_amqp::ConnectionOptions::new()
            .address(common::amqp_url())
            .observer(Published {
                count: AtomicUsize::new(0),
                n,
                done: tx,
            }),
    )?;
    let options = OutboxRelayOptions::new()
        .batch_size(100)
        .interval(Duration::from_millis(5));
    let relay = OutboxRelay::new(&connection, store, options)?;
    let start = Instant::now();
    let relay = relay.start()?;
    let end = rx
        .recv_timeout(Duration::from_secs(600))
        .map_err(|_| Error::Closed { what: "bench" })?;
    relay.close()?;
    connection.close()?;
    Ok(rate(n, end - start))
}

/// The suite's `i`-th outbox record to `queue`: ~200 bytes of JSON.
fn outbox_record(queue: &str, i: usize) -> Result<acemq_amqp::patterns::outbox::NewOutboxRecord> {
    let payload = serde_json::json!({"n": i, "pad": "x".repeat(180)});
    record(&JsonCodec, "", queue, &payload)
}

/// Adds `n` records ([`outbox_record`]), 500 per transaction.
fn fill_outbox(
    store: &SqlOutboxStore,
    mut in_tx: impl FnMut(&mut dyn FnMut(&mut dyn Sql) -> Result<()>) -> Result<()>,
    queue: &str,
    n: usize,
) -> Result<()> {
    for chunk in 0..n.div_ceil(500) {
        in_tx(&mut |tx: &mut dyn Sql| {
            for i in 0..500.min(n - chunk * 500) {
                store.add(tx, &outbox_record(queue, i)?)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn relaying(s: &mut Suite, conn: &Connection, dir: &std::path::Path) -> Result<()> {
    let run = std::process::id();
    let queue = format!("bench.relay.{run}");
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(5_000, 1_000);
    let lite_pool = sqlite_pool(&dir.join("outbox.db"), 4)?;
    let lite_store = || {
        SqlOutboxStore::open(
            checkout(&lite_pool),
            SqlOutboxStoreOptions::default().table("bench_outbox"),
        )
    };
    let pg_table = format!("bench_outbox_{run}");
    let pg = pg_pool(4)?;
    let pg_store = || {
        SqlOutboxStore::open(
            checkout(&pg),
            SqlOutboxStoreOptions::default().table(pg_table.clone()),
        )
    };
    let my_table = format!("bench_outbox_my_{run}");
    let my = my_pool(4)?;
    let my_store = || {
        SqlOutboxStore::open(
            checkout(&my),
            SqlOutboxStoreOptions::default().table(my_table.clone()),
        )
    };
    lite_store()?.create_table()?;
    pg_store()?.create_table()?;
    my_store()?.create_table()?;
    let (mut env, mut lite, mut post, mut memory) = (vec![], vec![], vec![], vec![]);
    let mut mine = vec![];
    for _ in 0..s.rounds {
        conn.purge_queue(&queue)?;
        env.push(rate(n, raw_publish(&queue, n, 100, true)));
        // The relay with no database under it: what the relay's own work costs.
        conn.purge_queue(&queue)?;
        let store = InMemoryOutboxStore::new();
        for i in 0..n {
            store.add(&outbox_record(&queue, i)?)?;
        }
        memory.push(relay_rate(store, n)?);
        conn.purge_queue(&queue)?;
        fill_outbox(
            &lite_store()?,
            |f| {
                let mut c = lite_pool.get()?;
                let mut tx = c.transaction().map_err(|e| sql_err("begin", e))?;
                f(&mut tx)?;
                tx.commit().map_err(|e| sql_err("commit", e))
            },
            &queue,
            n,
        )?;
        lite.push(relay_rate(lite_store()?, n)?);
        conn.purge_queue(&queue)?;
        fill_outbox(
            &pg_store()?,
            |f| {
                let mut c = pg.get()?;
                let mut tx = c.transaction().map_err(|e| sql_err("begin", e))?;
                f(&mut tx)?;
                tx.commit().map_err(|e| sql_err("commit", e))
            },
            &queue,
            n,
        )?;
        post.push(relay_rate(pg_store()?, n)?);
        conn.purge_queue(&queue)?;
        fill_outbox(
            &my_store()?,
            |f| {
                let mut c = my.get()?;
                let mut tx = c.begin()?;
                f(&mut tx)?;
                tx.commit().map_err(|e| sql_err("commit", e))
            },
            &queue,
            n,
        )?;
        mine.push(relay_rate(my_store()?, n)?);
    }
    let env = median(env);
    for (db, v, target) in [
        ("SQLite FULL", lite, Target::RatioAtLeast(0.9)),
        ("PostgreSQL", post, Target::RatioAtLeast(0.8)),
        ("MySQL", mine, Target::None),
        ("memory (no database)", memory, Target::None),
    ] {
        s.push(Row {
            figure: format!("outbox relay from {db} vs raw+env"),
            unit: "msg/s",
            ours: Some(median(v)),
            raw: Some(env),
            target,
            rss_mib: 0.0,
            note: format!("{n} records, batch 100; raw: windows of 100"),
        });
    }
    drop_pg_tables(&[pg_table])?;
    drop_my_tables(&[my_table])?;
    conn.purge_queue(&queue)?;
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The stores against raw commits (the former bench_stores)

/// Runs `op` for `phase`; operations (commits) per second, `commits_per_op` counted per call.
fn commits_rate(
    phase: Duration,
    commits_per_op: u64,
    mut op: impl FnMut(u64) -> Result<()>,
) -> Result<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < phase {
        op(n)?;
        n += 1;
    }
    Ok((n * commits_per_op) as f64 / start.elapsed().as_secs_f64())
}

fn store_record(n: u64) -> acemq_amqp::patterns::outbox::NewOutboxRecord {
    acemq_amqp::patterns::outbox::NewOutboxRecord {
        exchange: "bench".into(),
        routing_key: format!("bench.{n}"),
        body: vec![0u8; 256],
        content_type: "application/octet-stream".into(),
        headers: serde_json::Map::new(),
    }
}

/// Raw single-row insert + commit, claim + confirm, and outbox add + pending(1) + delete, on
/// one pool; (raw commits/s, claim+confirm ops/s, outbox ops/s). The raw rate is measured
/// before and after the store phases and the better one kept.
fn store_figures<M>(
    pool: &r2d2::Pool<M>,
    tag: &str,
    phase: Duration,
    begin_add: impl Fn(
        &mut M::Connection,
        &SqlOutboxStore,
        &acemq_amqp::patterns::outbox::NewOutboxRecord,
    ) -> Result<i64>,
) -> Result<(f64, f64, f64)>
where
    M: r2d2::ManageConnection,
    M::Connection: Sql,
{
    use acemq_amqp::patterns::idempotency::{Claim, IdempotencyStore};
    use acemq_amqp::patterns::outbox::OutboxStore;
    let raw_table = format!("bench_raw_{tag}");
    pool.get()?.execute(
        &format!("CREATE TABLE {raw_table} (k TEXT PRIMARY KEY, v BIGINT)"),
        &[],
    )?;
    let idem = SqlIdempotencyStore::open(
        checkout(pool),
        SqlIdempotencyStoreOptions::default().table(format!("bench_sidem_{tag}")),
    )?;
    idem.create_table()?;
    let outbox = SqlOutboxStore::open(
        checkout(pool),
        SqlOutboxStoreOptions::default().table(format!("bench_soutbox_{tag}")),
    )?;
    outbox.create_table()?;
    let mut round = 0;
    let mut raw_rate = || -> Result<f64> {
        round += 1;
        let mut conn = pool.get()?;
        let d = conn.dialect();
        let sql = format!(
            "INSERT INTO {raw_table} (k, v) VALUES ({}, {})",
            d.placeholder(1),
            d.placeholder(2)
        );
        commits_rate(phase, 1, |n| {
            conn.execute(
                &sql,
                &[
                    acemq_amqp::sql::Value::Text(format!("raw-{round}-{n}")),
                    acemq_amqp::sql::Value::Integer(n as i64),
                ],
            )
            .map(drop)
        })
    };
    let raw_before = raw_rate()?;
    let claims = commits_rate(phase, 2, |n| {
        let key = format!("key-{n}");
        match idem.claim(&key)? {
            Claim::Claimed(token) => idem.confirm(&key, &token),
            other => Err(Error::InvalidArgument {
                reason: format!("fresh key {key} claimed as {other:?}"),
            }),
        }
    })?;
    let records = commits_rate(phase, 3, |n| {
        let id = begin_add(&mut *pool.get()?, &outbox, &store_record(n))?;
        match outbox.pending(1)?.first() {
            Some(r) if r.id == id => outbox.mark_published(r.id),
            other => Err(Error::InvalidArgument {
                reason: format!("pending returned {other:?}, expected id {id}"),
            }),
        }
    })?;
    let raw_after = raw_rate()?;
    Ok((raw_before.max(raw_after), claims, records))
}

fn stores(s: &mut Suite, dir: &std::path::Path) -> Result<()> {
    let phase = if s.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(3)
    };
    let tag = format!("s{}", std::process::id());
    let lite = sqlite_pool(&dir.join("stores.db"), 4)?;
    let lite_figures = store_figures(&lite, &tag, phase, |conn, outbox, rec| {
        let mut tx = conn.transaction().map_err(|e| sql_err("begin", e))?;
        let id = outbox.add(&mut tx, rec)?;
        tx.commit().map_err(|e| sql_err("commit", e))?;
        Ok(id)
    })?;
    let pg = pg_pool(4)?;
    let pg_figures = store_figures(&pg, &tag, phase, |conn, outbox, rec| {
        let mut tx = conn.transaction().map_err(|e| sql_err("begin", e))?;
        let id = outbox.add(&mut tx, rec)?;
        tx.commit().map_err(|e| sql_err("commit", e))?;
        Ok(id)
    });
    drop_pg_tables(&[
        format!("bench_raw_{tag}"),
        format!("bench_sidem_{tag}"),
        format!("bench_soutbox_{tag}"),
    ])?;
    let pg_figures = pg_figures?;
    for (db, (raw, claims, records)) in [("SQLite FULL", lite_figures), ("PostgreSQL", pg_figures)]
    {
        s.push(Row {
            figure: format!("store: claim + confirm on {db} vs raw insert + commit"),
            unit: "ops/s",
            ours: Some(claims),
            raw: Some(raw),
            target: Target::RatioAtLeast(0.7),
            rss_mib: 0.0,
            note: format!(
                "one op = one commit; {:.0} keys/s; phases of {:.1} s",
                claims / 2.0,
                phase.as_secs_f64()
            ),
        });
        s.push(Row {
            figure: format!("store: outbox add + pending + delete on {db} vs raw insert + commit"),
            unit: "ops/s",
            ours: Some(records),
            raw: Some(raw),
            target: Target::RatioAtLeast(0.7),
            rss_mib: 0.0,
            note: format!("one op = one commit; {:.0} records/s", records / 3.0),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The acknowledged recipe (SQLite FULL)

fn raw_commit_rate(path: &std::path::Path, n: usize) -> Result<f64> {
    let conn = rusqlite::Connection::open(path).map_err(|e| sql_err("open", e))?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; \
         CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
    )
    .map_err(|e| sql_err("setup", e))?;
    let mut insert = conn
        .prepare("INSERT INTO raw (body) VALUES (?1)")
        .map_err(|e| sql_err("prepare", e))?;
    let start = Instant::now();
    for _ in 0..n {
        insert
            .execute([r#"{"counter":"page_views","by":1}"#])
            .map_err(|e| sql_err("insert", e))?;
    }
    Ok(rate(n, start.elapsed()))
}

fn recipe_rate(path: &std::path::Path, batch: usize, n: usize) -> Result<f64> {
    let store = CounterStore::new(path, CounterStoreOptions::new())?;
    store.create_tables()?;
    let tag = path.display().to_string();
    let deliveries: Vec<Delivery<u64>> = (0..n)
        .map(|i| {
            Delivery::new(
                CounterIncrement::new(format!("c{}", i % 16), 1).message(format!("{tag}/{i}")),
                i as u64,
            )
        })
        .collect();
    let start = Instant::now();
    let report = consume(
        IterSource::new(deliveries),
        &store,
        |_: &Delivery<u64>| Ok(()),
        &Batcher::new(
            BatcherOptions::new()
                .batch_size(batch)
                .max_pending(batch * 2),
        )?,
    )?;
    assert_eq!(report.acknowledged, n as u64);
    Ok(rate(n, start.elapsed()))
}

/// The queue's acknowledgements, stopping the run once `n` deliveries were acknowledged and
/// noting when.
struct StopAfter<'a> {
    inner: AmqpAcknowledge<'a>,
    acknowledged: usize,
    n: usize,
    stop: StopHandle,
    end: &'a std::cell::Cell<Option<Instant>>,
}

impl StopAfter<'_> {
    fn count(&mut self, k: usize) {
        self.acknowledged += k;
        if self.acknowledged >= self.n && self.end.get().is_none() {
            self.end.set(Some(Instant::now()));
            self.stop.stop();
        }
    }
}

impl Acknowledge<AmqpToken> for StopAfter<'_> {
    fn acknowledge(&mut self, d: &Delivery<AmqpToken>) -> Result<()> {
        self.inner.acknowledge(d)?;
        self.count(1);
        Ok(())
    }
    fn acknowledge_batch(&mut self, ds: &[Delivery<AmqpToken>]) -> Result<()> {
        self.inner.acknowledge_batch(ds)?;
        self.count(ds.len());
        Ok(())
    }
    fn failed(&mut self, ds: &[Delivery<AmqpToken>], e: &Error) -> Result<()> {
        self.inner.failed(ds, e)
    }
    fn rejected(&mut self, d: &Delivery<AmqpToken>, e: &Error) -> Result<()> {
        self.inner.rejected(d, e)
    }
}

/// The recipe over RabbitMQ: `n` counter increments from `queue` through an [`AmqpQueue`]
/// (prefetch 65), batches of 32, on a SQLite FULL file, until all are acknowledged.
fn recipe_amqp_rate(
    conn: &Connection,
    queue: &str,
    path: &std::path::Path,
    n: usize,
) -> Result<f64> {
    let store = CounterStore::new(path, CounterStoreOptions::new())?;
    store.create_tables()?;
    let amqp = AmqpQueue::open(conn, queue, AmqpQueueOptions::new().prefetch(65))?;
    let stop = StopHandle::new();
    let batcher = Batcher::new(
        BatcherOptions::new()
            .batch_size(32)
            .max_pending(64)
            .poll_interval(Duration::from_millis(10))
            .stop_handle(stop.clone()),
    )?;
    let end = std::cell::Cell::new(None);
    let start = Instant::now();
    let acks = StopAfter {
        inner: amqp.acknowledger(),
        acknowledged: 0,
        n,
        stop,
        end: &end,
    };
    let report = consume(amqp.source()?, &store, acks, &batcher)?;
    amqp.close()?;
    assert_eq!(report.acknowledged, n as u64);
    let end = end.get().ok_or(Error::Closed { what: "bench" })?;
    Ok(rate(n, end - start))
}

fn acknowledged(s: &mut Suite, conn: &Connection, dir: &std::path::Path) -> Result<()> {
    let commits = s.n(500, 100);
    let mut raw = vec![];
    let mut by_batch: Vec<Vec<f64>> = vec![vec![]; 3];
    let batches = [
        (1usize, s.n(1_000, 150)),
        (32, s.n(20_000, 2_000)),
        (256, s.n(50_000, 5_000)),
    ];
    for round in 0..s.rounds {
        raw.push(raw_commit_rate(
            &dir.join(format!("raw-{round}.db")),
            commits,
        )?);
        for (i, (batch, n)) in batches.into_iter().enumerate() {
            let path = dir.join(format!("ack-{batch}-{round}.db"));
            by_batch[i].push(recipe_rate(&path, batch, n)?);
        }
    }
    let raw = median(raw);
    for ((batch, n), v) in batches.into_iter().zip(by_batch) {
        s.push(Row {
            figure: format!("acknowledged recipe, batch {batch}, vs SQLite commit"),
            unit: "msg/s",
            ours: Some(median(v)),
            raw: Some(raw),
            target: Target::None,
            rss_mib: 0.0,
            note: format!("{n} messages; raw: one-row insert + commit"),
        });
    }
    // Over RabbitMQ, against raw consume + ack of the same messages.
    let queue = format!("bench.ack.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(20_000, 2_000);
    let increment = |i: usize| CounterIncrement::new(format!("c{}", i % 16), 1).payload();
    let (mut raw, mut ours) = (vec![], vec![]);
    for round in 0..s.rounds {
        common::fill_queue(conn, &queue, n, increment)?;
        raw.push(rate(n, common::raw_consume(&queue, n, 100)));
        common::fill_queue(conn, &queue, n, increment)?;
        let path = dir.join(format!("ack-amqp-{round}.db"));
        ours.push(recipe_amqp_rate(conn, &queue, &path, n)?);
    }
    s.push(Row {
        figure: "acknowledged recipe over RabbitMQ (AmqpQueue), batch 32, vs consume + ack".into(),
        unit: "msg/s",
        ours: Some(median(ours)),
        raw: Some(median(raw)),
        target: Target::None,
        rss_mib: 0.0,
        note: format!("{n} messages, prefetch 65 (raw 100), SQLite FULL"),
    });
    conn.purge_queue(&queue)?;
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Request/reply (the measurement of the former bench_rpc, as it was)

const RPC_BODY: &[u8] = b"{\"sku\":\"sku-42\"}";

/// A raw amiquip responder on its own thread and connection: reply, then ack. With `envelope`
/// the reply carries the family's envelope headers, built per reply as the library builds them
/// (a fresh id, the request's correlation and id as correlation and causation).
fn raw_responder(
    queue: String,
    stop: Arc<AtomicBool>,
    envelope: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn = common::raw_connection();
        let ch = conn.open_channel(None).expect("channel");
        ch.qos(0, 32, false).expect("qos");
        let consumer = ch
            .basic_consume(queue.clone(), RawConsumerOptions::default())
            .expect("consume");
        loop {
            let Ok(m) = consumer.receiver().recv_timeout(Duration::from_millis(100)) else {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                continue;
            };
            let ConsumerMessage::Delivery(d) = m else {
                break;
            };
            let to = d.properties.reply_to().clone().expect("reply_to");
            let mut props = if envelope {
                let header = |name: &str| {
                    d.properties
                        .headers()
                        .as_ref()
                        .and_then(|h| h.get(name))
                        .and_then(|v| match v {
                            amiquip::AmqpValue::LongString(s) => Some(s.clone()),
                            _ => None,
                        })
                };
                let mut reply = Message::new(&b"{\"price\":12.5}"[..]).with_persistent(false);
                reply.envelope.correlation_id = header("x-acemq-correlation");
                reply.envelope.causation_id = d.properties.message_id().clone();
                to_amiquip_properties(reply.to_properties_for_bench(&to, "acemq@bench"))
            } else {
                AmqpProperties::default().with_delivery_mode(1)
            };
            if let Some(c) = d.properties.correlation_id() {
                props = props.with_correlation_id(c.clone());
            }
            ch.basic_publish("", Publish::with_properties(b"{\"price\":12.5}", to, props))
                .expect("reply");
            d.ack(&ch).expect("ack");
        }
        consumer.cancel().expect("cancel");
        for m in consumer.receiver().iter() {
            if !matches!(m, ConsumerMessage::Delivery(_)) {
                break;
            }
        }
        drop(consumer);
        conn.close().expect("close");
    })
}

/// One raw caller: `n` sequential round trips; their latencies. With `envelope` each request
/// carries the family's envelope headers (a fresh id and correlation, `acemq-reply-to`), built
/// per request as the library builds them.
fn raw_caller(queue: &str, n: usize, envelope: bool) -> Vec<Duration> {
    let mut conn = common::raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    let reply = ch
        .queue_declare(
            "",
            amiquip::QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
        )
        .expect("reply queue");
    let reply_name = reply.name().to_string();
    let consumer = reply
        .consume(RawConsumerOptions {
            no_ack: true,
            exclusive: true,
            ..Default::default()
        })
        .expect("consume replies");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let correlation = format!("c{i}");
        let start = Instant::now();
        let props = if envelope {
            let mut m = Message::new(RPC_BODY)
                .with_persistent(false)
                .with_header("acemq-reply-to", reply_name.as_str())
                .with_reply_to(reply_name.as_str());
            m.envelope.correlation_id = Some(correlation.clone());
            to_amiquip_properties(m.to_properties_for_bench(queue, "acemq@bench"))
                .with_correlation_id(correlation.clone())
        } else {
            AmqpProperties::default()
                .with_delivery_mode(1)
                .with_reply_to(reply_name.clone())
                .with_correlation_id(correlation.clone())
        };
        ch.basic_publish("", Publish::with_properties(RPC_BODY, queue, props))
            .expect("request");
        loop {
            match consumer.receiver().recv().expect("reply") {
                ConsumerMessage::Delivery(d)
                    if d.properties.correlation_id().as_deref() == Some(correlation.as_str()) =>
                {
                    break
                }
                ConsumerMessage::Delivery(_) => continue,
                other => panic!("reply consumer ended: {other:?}"),
            }
        }
        lat.push(start.elapsed());
    }
    consumer.cancel().expect("cancel");
    for m in consumer.receiver().iter() {
        if !matches!(m, ConsumerMessage::Delivery(_)) {
            break;
        }
    }
    drop(consumer);
    conn.close().expect("close");
    lat
}

/// `callers` threads asking `n` each through one requester; all latencies and the wall time.
fn acemq_callers(
    requester: &RunningRequester,
    callers: usize,
    n: usize,
) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let lat: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|_| {
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        requester
                            .ask(Message::new(RPC_BODY).with_persistent(false))
                            .expect("reply");
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("caller"))
            .collect()
    });
    (lat, start.elapsed())
}

#[derive(Default)]
struct Stats {
    lat: Vec<Duration>,
    requests: usize,
    wall: Duration,
}

impl Stats {
    fn add(&mut self, lat: Vec<Duration>, wall: Duration) {
        self.requests += lat.len();
        self.lat.extend(lat);
        self.wall += wall;
    }
    fn pct(&mut self, p: f64) -> f64 {
        self.lat.sort();
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i].as_secs_f64() * 1e3
    }
    fn rate(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }
}

fn request_reply(s: &mut Suite, conn: &Connection) -> Result<()> {
    let n = s.n(2_000, 200);
    let pid = std::process::id();
    let raw_q = format!("bench.rpc.raw.{pid}");
    let env_q = format!("bench.rpc.env.{pid}");
    let our_q = format!("bench.rpc.acemq.{pid}");
    let worker_q = format!("bench.rpc.worker.{pid}");
    for q in [&raw_q, &env_q, &our_q, &worker_q] {
        conn.declare_queue(&QueueSpec::new(q).classic())?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let raw_thread = raw_responder(raw_q.clone(), stop.clone(), false);
    let env_thread = raw_responder(env_q.clone(), stop.clone(), true);
    let server = Connection::open(&common::amqp_url())?;
    // The raw responder answers on the thread that reads the requests: ours does too (inline).
    let price = |_: &Message| Ok::<_, BoxError>(&b"{\"price\":12.5}"[..]);
    let responder = Responder::new(
        &server,
        &our_q,
        ResponderOptions::new().consumer(ConsumerOptions::new().inline(true).declare(false)),
    )?
    .start(price)?;
    // `serve`'s default: the handler on a worker thread.
    let worker_responder = Responder::new(
        &server,
        &worker_q,
        ResponderOptions::new().consumer(ConsumerOptions::new().declare(false)),
    )?
    .start(price)?;
    let requester = Requester::new(conn, RequesterOptions::new().routing_key(&our_q))?.start()?;
    let worker_requester =
        Requester::new(conn, RequesterOptions::new().routing_key(&worker_q))?.start()?;
    raw_caller(&raw_q, 100, false);
    raw_caller(&env_q, 100, true);
    acemq_callers(&requester, 1, 100);
    acemq_callers(&worker_requester, 1, 100);
    let (mut raw, mut one, mut eight) = (Stats::default(), Stats::default(), Stats::default());
    let mut on_worker = Stats::default();
    let mut env = Stats::default();
    let (mut raw_to_ours, mut ours_to_raw) = (Stats::default(), Stats::default());
    let env_requester =
        Requester::new(conn, RequesterOptions::new().routing_key(&env_q))?.start()?;
    for _ in 0..s.rounds {
        let t = Instant::now();
        let lat = raw_caller(&raw_q, n, false);
        raw.add(lat, t.elapsed());
        let t = Instant::now();
        let lat = raw_caller(&env_q, n, true);
        env.add(lat, t.elapsed());
        let (lat, wall) = acemq_callers(&requester, 1, n);
        one.add(lat, wall);
        let (lat, wall) = acemq_callers(&requester, 8, n);
        eight.add(lat, wall);
        let (lat, wall) = acemq_callers(&worker_requester, 1, n);
        on_worker.add(lat, wall);
        let t = Instant::now();
        let lat = raw_caller(&our_q, n, false);
        raw_to_ours.add(lat, t.elapsed());
        let (lat, wall) = acemq_callers(&env_requester, 1, n);
        ours_to_raw.add(lat, wall);
    }
    let raw_rate = raw.rate();
    let (raw50, raw99) = (raw.pct(0.5), raw.pct(0.99));
    let (env_rate, env50) = (env.rate(), env.pct(0.5));
    let one_rate = one.rate();
    let (one50, one99) = (one.pct(0.5), one.pct(0.99));
    let (eight50, eight99) = (eight.pct(0.5), eight.pct(0.99));
    s.push(Row {
        figure: "request/reply, Requester, 1 caller vs raw 1 caller".into(),
        unit: "req/s",
        ours: Some(one_rate),
        raw: Some(raw_rate),
        target: Target::RatioAtLeast(0.8),
        rss_mib: 0.0,
        note: format!(
            "p50 {one50:.2} ms, p99 {one99:.2} ms (raw {raw50:.2} / {raw99:.2}); {n} per caller"
        ),
    });
    s.push(Row {
        figure: "request/reply, Requester, 1 caller vs raw+env 1 caller".into(),
        unit: "req/s",
        ours: Some(one_rate),
        raw: Some(env_rate),
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "raw+env: raw amiquip carrying the family's envelope headers on request and reply; \
             its p50 {env50:.2} ms"
        ),
    });
    s.push(Row {
        figure: "request/reply, Requester, 1 caller, p50 round trip".into(),
        unit: "ms",
        ours: Some(one50),
        raw: None,
        target: Target::AtMost(1.0),
        rss_mib: 0.0,
        note: format!("raw p50 {raw50:.2} ms"),
    });
    s.push(Row {
        figure: "request/reply, Requester, 8 callers vs the Requester's 1 caller".into(),
        unit: "req/s",
        ours: Some(eight.rate()),
        raw: Some(one_rate),
        target: Target::RatioAtLeast(3.0),
        rss_mib: 0.0,
        note: format!(
            "p50 {eight50:.2} ms, p99 {eight99:.2} ms; {n} per caller; {:.2}x raw 1 caller",
            eight.rate() / raw_rate
        ),
    });
    s.push(Row {
        figure: "request/reply, Requester, 1 caller, Responder on a worker vs raw 1 caller".into(),
        unit: "req/s",
        ours: Some(on_worker.rate()),
        raw: Some(raw_rate),
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "serve's default (handler on a worker, one hand-off to the consumer thread per \
             request); the rows above run it inline; p50 {:.2} ms",
            on_worker.pct(0.5)
        ),
    });
    s.push(Row {
        figure: "request/reply, raw caller → Responder vs raw 1 caller".into(),
        unit: "req/s",
        ours: Some(raw_to_ours.rate()),
        raw: Some(raw_rate),
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "where the gap is: the library's responder alone; p50 {:.2} ms",
            raw_to_ours.pct(0.5)
        ),
    });
    s.push(Row {
        figure: "request/reply, Requester → raw+env responder vs raw+env 1 caller".into(),
        unit: "req/s",
        ours: Some(ours_to_raw.rate()),
        raw: Some(env_rate),
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "where the gap is: the library's requester alone; p50 {:.2} ms",
            ours_to_raw.pct(0.5)
        ),
    });
    env_requester.close()?;
    requester.close()?;
    worker_requester.close()?;
    responder.close()?;
    worker_responder.close()?;
    server.close()?;
    stop.store(true, Ordering::SeqCst);
    for t in [raw_thread, env_thread] {
        t.join().map_err(|_| Error::Closed {
            what: "raw responder",
        })?;
    }
    for q in [&raw_q, &env_q, &our_q, &worker_q] {
        conn.delete_queue(q)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Ordered dispatch (the former bench_ordered)

const ORDERED_PREFETCH: u16 = 200;
const ORDERED_WORK: Duration = Duration::from_millis(1);
const ORDERED_KEYS: usize = 20;

/// `n` transient 200-byte messages over `ORDERED_KEYS` keys (header `k`).
fn fill_keyed(conn: &Connection, queue: &str, n: usize) -> Result<()> {
    let p = conn.publisher_with(PublisherOptions::new().window(2000))?;
    let mut tickets = Vec::with_capacity(1000);
    for i in 0..n {
        let m = Message::new(BODY.to_vec())
            .with_persistent(false)
            .with_header("k", format!("key-{}", i % ORDERED_KEYS));
        tickets.push(p.publish_deferred("", queue, m)?);
        if tickets.len() == 1000 {
            for t in tickets.drain(..) {
                t.wait()?;
            }
        }
    }
    for t in tickets {
        t.wait()?;
    }
    p.close()
}

/// The library consuming `n` messages with the 1 ms handler, plain or `ordered`.
fn ours_with_work(
    conn: &Connection,
    queue: &str,
    n: usize,
    concurrency: usize,
    keyed: bool,
) -> Result<Duration> {
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let work = move |_: &Message| {
        std::thread::sleep(ORDERED_WORK);
        if count.fetch_add(1, Ordering::Relaxed) + 1 == n {
            let _ = tx.try_send(Instant::now());
        }
        Ok(Outcome::Accept)
    };
    let options = ConsumerOptions::new()
        .prefetch(ORDERED_PREFETCH)
        .concurrency(concurrency)
        .declare(false);
    let start = Instant::now();
    let consumer = conn.consumer(queue, options)?;
    let consumer = if keyed {
        consumer.start(ordered(by_header("k"), work))?
    } else {
        consumer.start(work)?
    };
    let end = rx
        .recv_timeout(Duration::from_secs(600))
        .map_err(|_| Error::Closed { what: "bench" })?;
    consumer.close()?;
    Ok(end - start)
}

fn ordered_dispatch(s: &mut Suite, conn: &Connection) -> Result<()> {
    let n = s.n(2_000, 400);
    let queue = format!("bench.ordered.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let (mut raw, mut one, mut eight, mut keyed) = (vec![], vec![], vec![], vec![]);
    for _ in 0..s.rounds {
        fill_keyed(conn, &queue, n)?;
        raw.push(rate(
            n,
            common::raw_consume_with(&queue, n, ORDERED_PREFETCH, || {
                std::thread::sleep(ORDERED_WORK)
            }),
        ));
        fill_keyed(conn, &queue, n)?;
        one.push(rate(n, ours_with_work(conn, &queue, n, 1, false)?));
        fill_keyed(conn, &queue, n)?;
        eight.push(rate(n, ours_with_work(conn, &queue, n, 8, false)?));
        fill_keyed(conn, &queue, n)?;
        keyed.push(rate(n, ours_with_work(conn, &queue, n, 8, true)?));
    }
    let (raw, one, eight, keyed) = (median(raw), median(one), median(eight), median(keyed));
    let note =
        format!("{n} msgs over {ORDERED_KEYS} keys, 1 ms handlers, prefetch {ORDERED_PREFETCH}");
    s.push(Row {
        figure: "ordered dispatch, concurrency 8, vs unordered at concurrency 8".into(),
        unit: "msg/s",
        ours: Some(keyed),
        raw: Some(eight),
        target: Target::RatioAtLeast(0.7),
        rss_mib: 0.0,
        note: note.clone(),
    });
    s.push(Row {
        figure: "unordered, concurrency 1, vs raw (handler on the consuming thread)".into(),
        unit: "msg/s",
        ours: Some(one),
        raw: Some(raw),
        target: Target::None,
        rss_mib: 0.0,
        note: format!("{note}; concurrency 8 runs {:.1}x raw", eight / raw),
    });
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scheduler accuracy

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Messages scheduled 1–3 s ahead through the TTL ladder: how late each is delivered.
fn scheduler_accuracy(s: &mut Suite, conn: &Connection) -> Result<()> {
    use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
    let n = s.n(100, 20);
    let queue = format!("bench.scheduled.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let scheduler = Scheduler::new(conn, SchedulerOptions::default()).and_then(Scheduler::start)?;
    let late = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(n)));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let l = late.clone();
    let consumer = conn
        .consumer(&queue, ConsumerOptions::new().declare(false))?
        .start(move |m: &Message| {
            let due: i64 = String::from_utf8_lossy(&m.body).parse().unwrap_or(0);
            let mut late = l.lock();
            late.push((now_ms() - due) as f64);
            if late.len() == n {
                let _ = tx.try_send(());
            }
            Ok(Outcome::Accept)
        })?;
    for i in 0..n {
        let delay = Duration::from_millis(1_000 + (i as u64 * 2_000 / n as u64));
        let due = now_ms() + delay.as_millis() as i64;
        scheduler.after(delay, "", &queue, Message::new(due.to_string()))?;
    }
    rx.recv_timeout(Duration::from_secs(120))
        .map_err(|_| Error::Closed { what: "bench" })?;
    consumer.close()?;
    scheduler.close()?;
    conn.delete_queue(&queue)?;
    let mut late = late.lock().clone();
    late.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| late[((late.len() as f64 - 1.0) * p).round() as usize];
    s.push(Row {
        figure: "scheduler accuracy, p99 lateness".into(),
        unit: "ms",
        ours: Some(pct(0.99)),
        raw: None,
        target: Target::None,
        rss_mib: 0.0,
        note: format!(
            "{n} messages due 1–3 s ahead; p50 {:.0} ms, max {:.0} ms late",
            pct(0.5),
            pct(1.0)
        ),
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Memory

fn memory(s: &mut Suite, conn: &Connection) -> Result<()> {
    let queue = format!("bench.memory.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let n = s.n(200_000, 20_000);
    fill(conn, &queue, n)?;
    reset_peak_rss();
    let before = rss_mib();
    let opts = ConsumerOptions::new().prefetch(100).concurrency(8);
    our_consume(conn, &queue, n, opts, |_: &Message| Ok(Outcome::Accept))?;
    let peak = peak_rss_mib();
    s.push(Row {
        figure: format!("memory: consuming a {n}-message backlog"),
        unit: "MiB",
        ours: Some(peak),
        raw: None,
        target: Target::AtMost(64.0),
        rss_mib: 0.0,
        note: format!(
            "peak RSS of the process (RSS {before:.0} MiB before); prefetch 100, concurrency 8"
        ),
    });
    conn.purge_queue(&queue)?;

    // 10,000 deferred tickets outstanding on a publisher with a window of 500: the window
    // bounds what is in flight; a ticket is small.
    let tickets_n = 10_000;
    reset_peak_rss();
    let before = rss_mib();
    heap::start();
    let publisher = conn.publisher_with(PublisherOptions::new().window(500))?;
    let mut tickets = Vec::with_capacity(tickets_n);
    for _ in 0..tickets_n {
        tickets.push(publisher.publish_deferred("", &queue, Message::new(&BODY[..]))?);
    }
    let held = rss_mib();
    for t in tickets {
        t.wait()?;
    }
    publisher.close()?;
    let heap_peak = heap::stop_peak_mib();
    let peak = peak_rss_mib();
    s.push(Row {
        figure: format!("memory: publisher, {tickets_n} deferred tickets held, window 500"),
        unit: "MiB",
        ours: Some(heap_peak),
        raw: None,
        target: Target::AtMost(16.0),
        rss_mib: 0.0,
        note: format!(
            "peak heap growth (counted by the bench's allocator); RSS {before:.0} MiB before, \
             {held:.0} MiB with all tickets held, peak {peak:.0} MiB"
        ),
    });
    conn.purge_queue(&queue)?;
    conn.delete_queue(&queue)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn main() {
    fail::run(bench);
}

fn bench() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    // `--only NAME[,NAME]`: publish, consume, idempotent, relay, stores, acknowledged, rpc,
    // ordered, scheduler, memory, inproc.
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    if let Some(a) = args.iter().enumerate().find_map(|(i, a)| {
        let known = a == "--quick" || a == "--json" || a == "--only";
        let value = i > 0 && args[i - 1] == "--only";
        (!known && !value).then_some(a)
    }) {
        eprintln!("unknown argument {a:?}: use [--quick] [--json] [--only NAME,…]");
        std::process::exit(2);
    }
    let mut s = Suite {
        quick,
        json,
        rounds: if quick { 3 } else { 5 },
        rows: vec![],
    };
    let started = Instant::now();
    let load_before = load_average();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    if !json {
        println!(
            "acemq-amqp benchmark suite ({}), {} rounds, medians; {cpus} CPUs; load average {load_before}",
            if quick { "--quick" } else { "full" },
            s.rounds
        );
        println!();
        println!("| figure | unit | ours | raw | ratio | target | met | peak RSS MiB | note |");
        println!("|---|---|---:|---:|---:|---|---|---:|---|");
    }
    let conn = Connection::open(&common::amqp_url())?;
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "a temporary directory".into(),
        source: e,
    })?;
    if wanted("publish") {
        s.figure(|s| publishing(s, &conn))?;
    }
    if wanted("consume") {
        s.figure(|s| consuming(s, &conn))?;
    }
    if wanted("idempotent") {
        s.figure(|s| idempotency(s, &conn, dir.path()))?;
    }
    if wanted("relay") {
        s.figure(|s| relaying(s, &conn, dir.path()))?;
    }
    if wanted("stores") {
        s.figure(|s| stores(s, dir.path()))?;
    }
    if wanted("acknowledged") {
        s.figure(|s| acknowledged(s, &conn, dir.path()))?;
    }
    if wanted("rpc") {
        s.figure(|s| request_reply(s, &conn))?;
    }
    if wanted("ordered") {
        s.figure(|s| ordered_dispatch(s, &conn))?;
    }
    if wanted("scheduler") {
        s.figure(|s| scheduler_accuracy(s, &conn))?;
    }
    if wanted("memory") {
        s.figure(|s| memory(s, &conn))?;
    }
    if wanted("inproc") {
        s.figure(in_process)?;
    }
    conn.close()?;
    let load_after = load_average();
    if json {
        let load = format!("{load_before} → {load_after}");
        for row in &s.rows {
            println!("{}", row.json(&load));
        }
    } else {
        let met = s.rows.iter().filter(|r| r.met() == Some(true)).count();
        let missed = s.rows.iter().filter(|r| r.met() == Some(false)).count();
        println!();
        println!(
            "targets met {met}, missed {missed}; took {:.0} s; load average {load_before} → {load_after}",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
