//! Crash windows (issue 17): a relay or consumer runs in a child process (this test binary,
//! re-run as `crash_child`) that is killed with SIGKILL, again and again, then restarted.
//! Every other round the child holds at the exact window (after the broker confirmed, before
//! the record is deleted or the delivery acknowledged) and is killed there; the other rounds it
//! is killed at a random moment. At the end the work is finished without kills and checked:
//!
//! * relay killed between publish and delete → the record is published again, the duplicate is
//!   absorbed downstream (`idempotent`), none lost, outbox empty;
//! * consumer (`idempotent_tx`) killed between commit and ack → the redelivery applies nothing
//!   twice;
//! * consumer killed while a retry copy is being published → every message is still accepted
//!   (duplicates possible, losses not).
//!
//! * replay killed between a confirmed copy and the original's ack → none lost;
//! * scheduler killed between a confirmed hop or delivery and the control message's ack → none
//!   lost.
//!
//! * ordered dispatch killed between a handled message and its ack → every message handled,
//!   and per key the messages were first handled in the order they were published (a
//!   redelivered one may be handled again, never after a later one of its key).
//!
//! Each scenario prints its figures.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::{OutboxEvent, PublishOutcome, Settlement};
use acemq_amqp::patterns::idempotency::{
    InMemoryIdempotencyStore, SqlIdempotencyStore, SqlIdempotencyStoreOptions,
};
use acemq_amqp::patterns::idempotent::{idempotent, idempotent_tx, IdempotentOptions};
use acemq_amqp::patterns::ordering::{by_header, ordered};
use acemq_amqp::patterns::outbox::{
    record_message, OutboxRelay, OutboxRelayOptions, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::replay::{replay, ReplayOptions};
use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
use acemq_amqp::sql::{Sql, Value};
use acemq_amqp::{
    headers, Connection, ConnectionOptions, ConsumerOptions, Handler, Message, Outcome, QueueSpec,
    RetryPolicy,
};
use support::db::{self, Db};
use support::{connect, connect_with, unique, Cleanup};

const ROUNDS: usize = 12;
/// Fresh messages or records added before each round (`kill_rounds`), so that a round killed at
/// a random moment has work in hand too, however far the rounds before it got.
const REFILL: usize = 20;
const ROLE: &str = "ACEMQ_CRASH17_ROLE";

/// Where the child holds: prints `WINDOW` and waits to be killed.
struct HoldAt {
    what: &'static str,
    hold: bool,
}

impl HoldAt {
    fn reached(&self) {
        if self.hold {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "WINDOW");
            let _ = out.flush();
            std::thread::sleep(Duration::from_secs(120));
            eprintln!("the parent never killed the child at {}", self.what);
            std::process::exit(3);
        }
    }
}

impl Observer for HoldAt {
    fn outbox(&self, event: &OutboxEvent<'_>) {
        // Confirmed, not yet deleted.
        if self.what == "relay" && matches!(event, OutboxEvent::Published { .. }) {
            self.reached();
        }
    }
    fn settled(&self, s: &Settlement<'_>) {
        // Committed (or, ordered, handled and recorded), not yet acknowledged.
        if matches!(self.what, "commit" | "ordered") && s.outcome == "accept" {
            self.reached();
        }
    }
    fn published(&self, _exchange: &str, outcome: PublishOutcome) {
        // The retry copy, the replayed copy, the scheduler's hop or delivery is confirmed; the
        // original is not acknowledged yet.
        if matches!(self.what, "retry" | "replay" | "scheduler")
            && matches!(outcome, PublishOutcome::Confirmed)
        {
            self.reached();
        }
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set for the child"))
}

fn pg_factory() -> impl Fn() -> acemq_amqp::Result<Box<dyn Sql + Send>> + Send + Sync + 'static {
    || Ok(Box::new(db::pg_connect()?) as Box<dyn Sql + Send>)
}

fn outbox_store(table: &str) -> SqlOutboxStore {
    SqlOutboxStore::open(
        pg_factory(),
        SqlOutboxStoreOptions::default()
            .table(table)
            .lease(Duration::from_millis(500)),
    )
    .unwrap()
}

fn idem_store(table: &str) -> Arc<SqlIdempotencyStore> {
    Arc::new(
        SqlIdempotencyStore::open(
            pg_factory(),
            SqlIdempotencyStoreOptions::default().table(table),
        )
        .unwrap(),
    )
}

fn connection(observer: HoldAt) -> Connection {
    connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(observer),
    )
}

fn insert(tx: &mut dyn Sql, table: &str, id: &str) -> acemq_amqp::Result<u64> {
    tx.execute(
        &format!("INSERT INTO {table} (id) VALUES ($1)"),
        &[Value::Text(id.to_string())],
    )
}

/// The consumer of the commit scenario: one effect row per message in the idempotency
/// transaction.
fn commit_consumer(
    conn: &Connection,
    q: &str,
    idem: &str,
    effects: &str,
) -> acemq_amqp::RunningConsumer {
    let effects = effects.to_string();
    let handler = idempotent_tx(
        idem_store(idem),
        db::pg_connect,
        move |m: &Message, tx: &mut postgres::Transaction<'_>| {
            insert(tx, &effects, m.id())?;
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    conn.consumer(q, ConsumerOptions::new().concurrency(2).prefetch(10))
        .unwrap()
        .start(handler)
        .unwrap()
}

/// The consumer of the ordered scenario: four workers, ordered by the `k` header; each handled
/// message is recorded (key, seq, id) in its own statement, in the order handled (`n`), before
/// it is accepted (no idempotency: a redelivery handled again shows). The record is written
/// after the work, so it is in the order the handlers finished.
fn ordered_consumer(conn: &Connection, q: &str, effects: &str) -> acemq_amqp::RunningConsumer {
    let effects = effects.to_string();
    let handler = ordered(by_header("k"), move |m: &Message| {
        let key = m
            .headers
            .get("k")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let seq: i64 = String::from_utf8_lossy(&m.body).parse().unwrap_or(-1);
        // Work of uneven length (0–3 ms): unordered, two messages of one key handled at once
        // would finish, and be recorded, out of order.
        std::thread::sleep(Duration::from_millis(seq.unsigned_abs() * 7 % 4));
        let mut client = db::pg_connect()?;
        Sql::execute(
            &mut client,
            &format!("INSERT INTO {effects} (k, seq, id) VALUES ($1, $2, $3)"),
            &[
                Value::Text(key.to_string()),
                Value::Integer(seq),
                Value::Text(m.id().to_string()),
            ],
        )?;
        Ok(Outcome::Accept)
    });
    conn.consumer(q, ConsumerOptions::new().concurrency(4).prefetch(20))
        .unwrap()
        .start(handler)
        .unwrap()
}

/// The consumer of the retry scenario: the first attempt asks for a retry (a copy published
/// back to the queue after 20 ms, then the original acknowledged), the second is accepted and
/// recorded (no idempotency: duplicates show).
fn retry_consumer(conn: &Connection, q: &str, accepted: &str) -> acemq_amqp::RunningConsumer {
    let accepted = accepted.to_string();
    conn.consumer(
        q,
        ConsumerOptions::new()
            .concurrency(2)
            .prefetch(10)
            .retry(RetryPolicy::fixed(5, Duration::from_millis(20))),
    )
    .unwrap()
    .start(move |m: &Message| {
        if m.envelope.attempt == 1 {
            return Ok(Outcome::retry("the first attempt fails"));
        }
        insert(&mut db::pg_connect()?, &accepted, m.id())?;
        Ok(Outcome::Accept)
    })
    .unwrap()
}

fn scheduler_options(base: &str) -> SchedulerOptions {
    SchedulerOptions::new()
        .base(base)
        .rungs([Duration::from_secs(1)])
}

/// Every message id on `queue`, read to the end with a consumer (duplicates counted).
fn ids_on(conn: &Connection, queue: &str, at_least: usize) -> HashMap<String, u32> {
    let seen = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(queue, ConsumerOptions::new().prefetch(100).declare(false))
        .unwrap()
        .start(move |m: &Message| {
            *s.lock().unwrap().entry(m.id().to_string()).or_default() += 1;
            Ok(Outcome::Accept)
        })
        .unwrap();
    wait_for("every id read back", Duration::from_secs(60), || {
        seen.lock().unwrap().len() >= at_least
    });
    wait_for("the queue read to the end", Duration::from_secs(30), || {
        conn.queue_info(queue)
            .map(|i| i.message_count == 0)
            .unwrap_or(false)
    });
    consumer.close().unwrap();
    let all = seen.lock().unwrap().clone();
    all
}

/// Run as a child process by the crash tests; does nothing otherwise.
#[test]
#[ignore = "run as a child process by the crash tests"]
fn crash_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let hold = std::env::var("ACEMQ_CRASH17_HOLD").is_ok();
    let what = match role.as_str() {
        "relay" => "relay",
        "commit" => "commit",
        "retry" => "retry",
        "replay" => "replay",
        "scheduler" => "scheduler",
        "ordered" => "ordered",
        other => panic!("unknown role {other}"),
    };
    let conn = connection(HoldAt { what, hold });
    let _running: Box<dyn std::any::Any> = match what {
        "relay" => Box::new(
            OutboxRelay::new(
                &conn,
                outbox_store(&env("ACEMQ_CRASH17_OUTBOX")),
                OutboxRelayOptions::new()
                    .interval(Duration::from_millis(10))
                    .batch_size(10),
            )
            .unwrap()
            .start()
            .unwrap(),
        ),
        "commit" => Box::new(commit_consumer(
            &conn,
            &env("ACEMQ_CRASH17_QUEUE"),
            &env("ACEMQ_CRASH17_IDEM"),
            &env("ACEMQ_CRASH17_EFFECTS"),
        )),
        "retry" => Box::new(retry_consumer(
            &conn,
            &env("ACEMQ_CRASH17_QUEUE"),
            &env("ACEMQ_CRASH17_EFFECTS"),
        )),
        "scheduler" => Box::new(
            Scheduler::new(&conn, scheduler_options(&env("ACEMQ_CRASH17_BASE")))
                .and_then(Scheduler::start)
                .unwrap(),
        ),
        "ordered" => Box::new(ordered_consumer(
            &conn,
            &env("ACEMQ_CRASH17_QUEUE"),
            &env("ACEMQ_CRASH17_EFFECTS"),
        )),
        _ => {
            println!("READY");
            // Pass after pass until killed (each pass ends when the source is drained).
            loop {
                replay(
                    &conn,
                    &env("ACEMQ_CRASH17_QUEUE"),
                    ReplayOptions::default()
                        .exchange("")
                        .routing_key(env("ACEMQ_CRASH17_TARGET")),
                )
                .run()
                .unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    println!("READY");
    std::thread::sleep(Duration::from_secs(120));
    panic!("the child was never killed");
}

/// Runs `ROUNDS` children with `vars`, each killed with SIGKILL: held at the window on even
/// rounds, 20–800 ms after it is ready on odd ones. Returns (window kills, random kills).
///
/// `refill` runs before every held round and adds a little fresh work: a random-moment round
/// can finish everything that leads to the window (every first attempt already retried, the
/// outbox or the source drained), and a child with nothing left to do never reaches it.
fn kill_rounds(
    role: &str,
    vars: &[(&str, String)],
    mut refill: impl FnMut(),
    progress: impl Fn() -> String,
) -> (u32, u32) {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut at_window, mut random) = (0, 0);
    for round in 0..ROUNDS {
        let hold = round.is_multiple_of(2);
        refill();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if hold {
            cmd.env("ACEMQ_CRASH17_HOLD", "1");
        }
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child: Child = cmd.spawn().expect("start the child");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let wanted = if hold { "WINDOW" } else { "READY" };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut reached = false;
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.trim().ends_with(wanted) => {
                    reached = true;
                    break;
                }
                Ok(_) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    if let Some(status) = child.try_wait().unwrap() {
                        panic!("{role} child exited by itself ({status}) in round {round}");
                    }
                }
                Err(_) => break,
            }
        }
        if !hold && reached {
            std::thread::sleep(Duration::from_millis(20 + rand() % 780));
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().unwrap();
        assert!(
            reached || !hold,
            "{role} child never reached its window in round {round}"
        );
        if hold {
            at_window += 1;
        } else {
            random += 1;
        }
        println!(
            "crash {role} round {round}: killed ({status}) {}; {}",
            if hold {
                "at the window"
            } else {
                "at a random moment"
            },
            progress()
        );
    }
    (at_window, random)
}

fn pg_count(db: &Db, sql: &str) -> i64 {
    db.connect().query(sql, &[]).unwrap()[0][0]
        .as_i64()
        .unwrap()
}

fn id_counts(db: &Db, table: &str) -> HashMap<String, i64> {
    db.connect()
        .query(
            &format!("SELECT id, COUNT(*) FROM {table} GROUP BY id"),
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_i64().unwrap()))
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    assert!(support::eventually(timeout, &mut f), "timed out: {what}");
}

#[test]
fn relay_killed_between_publish_and_delete_duplicates_and_loses_nothing() {
    let n = 3000usize;
    let db = Db::postgres();
    let (conn, _clean, q) = support::declared_consumed_queue("crash-relay");
    let table = db.table("outbox");
    let store = outbox_store(&table);
    store.create_table().unwrap();
    let run = unique("r");
    let add = |ids: &[String]| {
        db.in_tx(true, |tx| {
            for id in ids {
                let m = Message::new(id.as_bytes().to_vec()).with_id(id.as_str());
                store.add(tx, &record_message("", &q, &m).unwrap()).unwrap();
            }
        })
    };
    let mut ids: Vec<String> = (0..n).map(|i| format!("{run}-{i}")).collect();
    add(&ids);
    let count_sql = format!("SELECT COUNT(*) FROM {table}");
    let (window, random) = kill_rounds(
        "relay",
        &[("ACEMQ_CRASH17_OUTBOX", table.clone())],
        || {
            let more: Vec<String> = (0..REFILL)
                .map(|i| format!("{run}-{}", ids.len() + i))
                .collect();
            add(&more);
            ids.extend(more);
        },
        || format!("{} records left in the outbox", pg_count(&db, &count_sql)),
    );
    let n = ids.len();

    // Restarted without kills: the relay drains the outbox; downstream, an idempotent consumer
    // applies each id once.
    let relay = OutboxRelay::new(
        &conn,
        outbox_store(&table),
        OutboxRelayOptions::new().interval(Duration::from_millis(20)),
    )
    .unwrap()
    .start()
    .unwrap();
    wait_for("the outbox drains", Duration::from_secs(60), || {
        pg_count(&db, &count_sql) == 0
    });
    let report = relay.close().unwrap();
    let applied = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let deliveries = Arc::new(AtomicU64::new(0));
    let (a, d) = (applied.clone(), deliveries.clone());
    let inner = idempotent(
        InMemoryIdempotencyStore::new(Duration::from_secs(600)),
        move |m: &Message| {
            *a.lock().unwrap().entry(m.id().to_string()).or_default() += 1;
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            d.fetch_add(1, Ordering::SeqCst);
            inner.handle(m)
        })
        .unwrap();
    wait_for("every id applied", Duration::from_secs(60), || {
        applied.lock().unwrap().len() == n
    });
    wait_for("the queue drains", Duration::from_secs(30), || {
        conn.queue_info(&q)
            .map(|i| i.message_count == 0)
            .unwrap_or(false)
    });
    consumer.close().unwrap();
    let applied = applied.lock().unwrap();
    let twice = applied.values().filter(|c| **c > 1).count();
    let deliveries = deliveries.load(Ordering::SeqCst);
    println!(
        "crash relay: {n} records, {window} kills at the window and {random} at random moments; \
         the restarted relay published {}; deliveries {deliveries}, duplicates absorbed {}; \
         applied {} ids, twice {twice}, lost {}",
        report.published,
        deliveries.saturating_sub(applied.len() as u64),
        applied.len(),
        n - applied.len()
    );
    assert_eq!(twice, 0, "a duplicate was applied twice");
    assert!(
        ids.iter().all(|id| applied.contains_key(id)),
        "lost records"
    );
}

#[test]
fn consumer_killed_between_commit_and_ack_repeats_no_effect() {
    let n = 1000usize;
    let db = Db::postgres();
    let (conn, _clean, q) = support::declared_consumed_queue("crash-commit");
    let idem = db.table("idem");
    idem_store(&idem).create_table().unwrap();
    let effects = db.table("effects");
    db.connect()
        .execute(&format!("CREATE TABLE {effects} (id TEXT NOT NULL)"), &[])
        .unwrap();
    let mut ids = support::publish_n(&conn, &q, n, true);
    let effects_sql = format!("SELECT COUNT(*) FROM {effects}");
    let (window, random) = kill_rounds(
        "commit",
        &[
            ("ACEMQ_CRASH17_QUEUE", q.clone()),
            ("ACEMQ_CRASH17_IDEM", idem.clone()),
            ("ACEMQ_CRASH17_EFFECTS", effects.clone()),
        ],
        || ids.extend(support::publish_n(&conn, &q, REFILL, true)),
        || format!("{} effects so far", pg_count(&db, &effects_sql)),
    );
    let n = ids.len();
    let consumer = commit_consumer(&conn, &q, &idem, &effects);
    wait_for("every message applied", Duration::from_secs(60), || {
        pg_count(&db, &format!("SELECT COUNT(DISTINCT id) FROM {effects}")) == n as i64
    });
    wait_for("the queue drains", Duration::from_secs(30), || {
        conn.queue_info(&q)
            .map(|i| i.message_count == 0)
            .unwrap_or(false)
    });
    consumer.close().unwrap();
    let counts = id_counts(&db, &effects);
    let twice = counts.values().filter(|c| **c > 1).count();
    println!(
        "crash commit: {n} messages, {window} kills between commit and ack and {random} at \
         random moments; effects {} for {} ids, applied twice {twice}, lost {}",
        counts.values().sum::<i64>(),
        counts.len(),
        n - counts.len()
    );
    assert_eq!(twice, 0, "an effect was repeated");
    assert!(
        ids.iter().all(|id| counts.contains_key(id)),
        "lost messages"
    );
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
}

#[test]
fn consumer_killed_while_a_retry_copy_is_published_loses_nothing() {
    let n = 500usize;
    let db = Db::postgres();
    let (conn, _clean, q) = support::declared_consumed_queue("crash-retry");
    let accepted = db.table("accepted");
    db.connect()
        .execute(&format!("CREATE TABLE {accepted} (id TEXT NOT NULL)"), &[])
        .unwrap();
    let mut ids = support::publish_n(&conn, &q, n, true);
    let sql = format!("SELECT COUNT(DISTINCT id) FROM {accepted}");
    let (window, random) = kill_rounds(
        "retry",
        &[
            ("ACEMQ_CRASH17_QUEUE", q.clone()),
            ("ACEMQ_CRASH17_EFFECTS", accepted.clone()),
        ],
        || ids.extend(support::publish_n(&conn, &q, REFILL, true)),
        || format!("{} accepted so far", pg_count(&db, &sql)),
    );
    let n = ids.len();
    let consumer = retry_consumer(&conn, &q, &accepted);
    wait_for("every message accepted", Duration::from_secs(60), || {
        pg_count(&db, &sql) == n as i64
    });
    wait_for("the queue drains", Duration::from_secs(30), || {
        conn.queue_info(&q)
            .map(|i| i.message_count == 0)
            .unwrap_or(false)
    });
    consumer.close().unwrap();
    let counts = id_counts(&db, &accepted);
    let dlq = conn
        .queue_info(&acemq_amqp::dead_letter_queue(&q))
        .unwrap()
        .message_count;
    println!(
        "crash retry: {n} messages, {window} kills with a retry copy confirmed but the \
         original unacknowledged and {random} at random moments; accepted {} ids ({} times), \
         duplicates {}, lost {}, dead-lettered {dlq}",
        counts.len(),
        counts.values().sum::<i64>(),
        counts.values().sum::<i64>() - counts.len() as i64,
        n - counts.len()
    );
    assert!(
        ids.iter().all(|id| counts.contains_key(id)),
        "lost messages"
    );
    assert_eq!(dlq, 0, "nothing should have run out of attempts");
}

#[test]
fn replay_killed_between_the_copy_and_the_ack_loses_nothing() {
    let n = 2000usize;
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let src = clean.queue(&unique("crash-replay-src"));
    let target = clean.queue(&unique("crash-replay-dst"));
    conn.declare_queue(&QueueSpec::new(&src).classic()).unwrap();
    conn.declare_queue(&QueueSpec::new(&target).classic())
        .unwrap();
    let mut ids = support::publish_n(&conn, &src, n, true);
    let count = |q: &str| conn.queue_info(q).map(|i| i.message_count).unwrap_or(0);
    let (window, random) = kill_rounds(
        "replay",
        &[
            ("ACEMQ_CRASH17_QUEUE", src.clone()),
            ("ACEMQ_CRASH17_TARGET", target.clone()),
        ],
        || ids.extend(support::publish_n(&conn, &src, REFILL, true)),
        || format!("{} moved so far", count(&target)),
    );
    let n = ids.len();
    // The broker takes back what the killed channels held; a pass without kills finishes.
    wait_for(
        "the source has no consumer",
        Duration::from_secs(30),
        || {
            conn.queue_info(&src)
                .map(|i| i.consumer_count == 0)
                .unwrap_or(false)
        },
    );
    let report = replay(
        &conn,
        &src,
        ReplayOptions::default()
            .exchange("")
            .routing_key(target.as_str()),
    )
    .run()
    .unwrap();
    assert_eq!(count(&src), 0, "the source is drained");
    let got = ids_on(&conn, &target, n);
    let twice = got.values().filter(|c| **c > 1).count();
    println!(
        "crash replay: {n} messages, {window} kills with a copy confirmed and its original \
         unacknowledged and {random} at random moments; the last pass moved {}; arrived {} ids, \
         {twice} twice, lost {}",
        report.moved,
        got.len(),
        n - got.len()
    );
    assert!(ids.iter().all(|id| got.contains_key(id)), "lost messages");
}

#[test]
fn scheduler_killed_between_a_hop_and_the_ack_loses_nothing() {
    let n = 200i64;
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let base = unique("crash-sched");
    clean.queue(&format!("{base}.1s"));
    clean.queue(&format!("{base}.due"));
    clean.exchange(&base);
    let q = clean.queue(&unique("crash-sched-dest"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    scheduler_options(&base).topology().apply(&conn).unwrap();
    // Scheduled messages on the 1 s rung, due over the next 2 to 12 s, as any scheduler writes
    // them.
    let p = conn.publisher().unwrap();
    let schedule = |count: i64, ids: &mut Vec<String>| {
        let now = acemq_amqp::now_ms();
        for i in 0..count {
            let m = Message::new(format!("m{}", ids.len()))
                .with_type(acemq_amqp::patterns::scheduler::SCHEDULED_MESSAGE_TYPE)
                .with_header(headers::SCHEDULE_EXCHANGE, "")
                .with_header(headers::SCHEDULE_ROUTING_KEY, q.as_str())
                .with_header(headers::SCHEDULE_DUE_AT, now + 2_000 + i * 50)
                .with_header(headers::SCHEDULE_CONTENT_TYPE, "text/plain");
            ids.push(m.id().to_string());
            p.publish(&base, &format!("{base}.1s"), m).unwrap();
        }
    };
    let mut ids = Vec::new();
    schedule(n, &mut ids);
    let delivered = || conn.queue_info(&q).map(|i| i.message_count).unwrap_or(0);
    let (window, random) = kill_rounds(
        "scheduler",
        &[("ACEMQ_CRASH17_BASE", base.clone())],
        || schedule(REFILL as i64, &mut ids),
        || format!("{} delivered so far", delivered()),
    );
    p.close().unwrap();
    let n = ids.len() as i64;
    let scheduler = Scheduler::new(&conn, scheduler_options(&base))
        .and_then(Scheduler::start)
        .unwrap();
    let got = ids_on(&conn, &q, n as usize);
    scheduler.close().unwrap();
    let twice = got.values().filter(|c| **c > 1).count();
    println!(
        "crash scheduler: {n} messages, {window} kills with a hop or delivery confirmed and the \
         control message unacknowledged and {random} at random moments; arrived {} ids, {twice} \
         twice, lost {}",
        got.len(),
        n as usize - got.len()
    );
    assert!(ids.iter().all(|id| got.contains_key(id)), "lost messages");
}

/// Publishes `count` messages over `keys` keys (`k` header), each key's seqs continuing from
/// `next`; returns them as (key, seq).
fn publish_keyed(
    conn: &Connection,
    q: &str,
    next: &mut HashMap<String, i64>,
    keys: usize,
    count: usize,
) -> Vec<(String, i64)> {
    let publisher = conn.publisher().unwrap();
    let mut sent = Vec::with_capacity(count);
    let mut tickets = Vec::new();
    for i in 0..count {
        let key = format!("key-{}", i % keys);
        let seq = next.entry(key.clone()).or_insert(0);
        let m = Message::new(seq.to_string()).with_header("k", key.as_str());
        tickets.push(publisher.publish_deferred("", q, m).unwrap());
        sent.push((key, *seq));
        *seq += 1;
    }
    for t in tickets {
        t.wait().unwrap();
    }
    publisher.close().unwrap();
    sent
}

#[test]
fn ordered_dispatch_killed_between_a_handled_message_and_its_ack_keeps_each_keys_order() {
    const KEYS: usize = 3;
    let db = Db::postgres();
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    // Classic: a requeued message goes back to its place in the queue.
    let q = clean.consumed_queue(&unique("crash-ordered"), &[]);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let effects = db.table("ordered");
    db.connect()
        .execute(
            &format!(
                "CREATE TABLE {effects} (n BIGSERIAL PRIMARY KEY, k TEXT NOT NULL, \
                 seq BIGINT NOT NULL, id TEXT NOT NULL)"
            ),
            &[],
        )
        .unwrap();
    let mut next = HashMap::new();
    let mut sent = publish_keyed(&conn, &q, &mut next, KEYS, 500);
    let count_sql = format!("SELECT COUNT(*) FROM {effects}");
    let (window, random) = kill_rounds(
        "ordered",
        &[
            ("ACEMQ_CRASH17_QUEUE", q.clone()),
            ("ACEMQ_CRASH17_EFFECTS", effects.clone()),
        ],
        || sent.extend(publish_keyed(&conn, &q, &mut next, KEYS, REFILL)),
        || format!("{} handled so far", pg_count(&db, &count_sql)),
    );
    let consumer = ordered_consumer(&conn, &q, &effects);
    let distinct = format!("SELECT COUNT(DISTINCT (k, seq)) FROM {effects}");
    wait_for("every message handled", Duration::from_secs(60), || {
        pg_count(&db, &distinct) == sent.len() as i64
    });
    wait_for("the queue drains", Duration::from_secs(30), || {
        conn.queue_info(&q)
            .map(|i| i.message_count == 0)
            .unwrap_or(false)
    });
    consumer.close().unwrap();
    // Per key, in the order handled: a seq seen before is a redelivery handled again; every
    // other one must be the next seq of its key.
    let rows = db
        .connect()
        .query(&format!("SELECT k, seq FROM {effects} ORDER BY n"), &[])
        .unwrap();
    let mut first_seen: HashMap<String, Vec<i64>> = HashMap::new();
    let mut again = 0;
    for r in &rows {
        let (k, seq) = (r[0].as_str().unwrap().to_string(), r[1].as_i64().unwrap());
        let seen = first_seen.entry(k).or_default();
        if seen.contains(&seq) {
            again += 1;
        } else {
            seen.push(seq);
        }
    }
    println!(
        "crash ordered: {} messages over {KEYS} keys, {window} kills between a handled message \
         and its ack and {random} at random moments; handled {} times, {again} of them again",
        sent.len(),
        rows.len()
    );
    for (k, seqs) in &first_seen {
        let expected: Vec<i64> = (0..next[k]).collect();
        assert_eq!(
            seqs, &expected,
            "key {k}: first handled out of order, or some lost"
        );
    }
    assert_eq!(first_seen.len(), KEYS);
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
}
