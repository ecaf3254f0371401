//! Edges of the idempotent consumer found by review (issue 35): a batch whose leader panics
//! outside the handler, wrappers that hid batching, and the chain order that let an overrun's
//! retry run beside its orphan. On the real broker, SQLite, PostgreSQL and MySQL/MariaDB.
#![cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::patterns::chain::{
    chain, with_idempotency, with_logging, with_ordering, with_timeout, BoxHandler, Layer,
};
use acemq_amqp::patterns::idempotency::{
    IdempotencyStore, InMemoryIdempotencyStore, SqlIdempotencyStore,
};
use acemq_amqp::patterns::idempotent::{
    idempotent_tx, IdempotentOptions, IdempotentTxBatchOptions,
};
use acemq_amqp::patterns::ordering::by_header;
use acemq_amqp::sql::Sql;
use acemq_amqp::{ConsumerOptions, Handler, HandlerResult, Message, Outcome, RetryPolicy};
use support::db::{self, Backend, Db};
use support::eventually;
use support::idem::{effects_table, keys, record_effect, recorder, store, OnCommit};

const WAIT: Duration = Duration::from_secs(30);

/// A batched wrapper whose `Debug` the test can read (what it learned of its callers).
trait Batched: Handler + std::fmt::Debug + Send + Sync {}
impl<T: Handler + std::fmt::Debug + Send + Sync> Batched for T {}

/// The batched wrapper behind a box, per backend.
fn batched_box(
    db: &Db,
    store: Arc<SqlIdempotencyStore>,
    effects: &str,
    (max, wait): (usize, Duration),
    panic_once: Option<Arc<AtomicBool>>,
    on_commit: OnCommit,
) -> Arc<dyn Batched> {
    let effects = effects.to_string();
    let work = move |m: &Message, tx: &mut dyn Sql| -> HandlerResult {
        record_effect(tx, &effects, m.id())?;
        Ok(Outcome::Accept)
    };
    let maybe_panic = move || {
        if let Some(flag) = &panic_once {
            if flag.swap(false, Ordering::SeqCst) {
                panic!("the connections factory panicked on purpose");
            }
        }
    };
    let batching = IdempotentTxBatchOptions::default()
        .max_messages(max)
        .max_wait(wait)
        .on_commit(move |n| on_commit(n));
    let options = IdempotentOptions::default();
    match db.backend {
        Backend::Sqlite => {
            let path = db.sqlite_path().to_path_buf();
            let connect = move || {
                maybe_panic();
                db::sqlite_open(&path)
            };
            let work = move |m: &Message, tx: &mut rusqlite::Transaction<'_>| work(m, tx);
            Arc::new(
                idempotent_tx(store, connect, work, options)
                    .batch(batching)
                    .unwrap(),
            )
        }
        Backend::Postgres => {
            let connect = move || {
                maybe_panic();
                db::pg_connect()
            };
            let work = move |m: &Message, tx: &mut postgres::Transaction<'_>| work(m, tx);
            Arc::new(
                idempotent_tx(store, connect, work, options)
                    .batch(batching)
                    .unwrap(),
            )
        }
        Backend::Mysql => {
            let connect = move || {
                maybe_panic();
                db::my_connect()
            };
            let work = move |m: &Message, tx: &mut mysql::Transaction<'_>| work(m, tx);
            Arc::new(
                idempotent_tx(store, connect, work, options)
                    .batch(batching)
                    .unwrap(),
            )
        }
    }
}

/// Waits (up to `WAIT`) for every thread to end; fails the test, naming `what`, if one hangs
/// (the hung threads are left behind: a hang must fail the test, not block it).
fn joined<T>(what: &str, threads: Vec<std::thread::JoinHandle<T>>) -> Vec<std::thread::Result<T>> {
    assert!(
        eventually(WAIT, || threads.iter().all(|t| t.is_finished())),
        "{what}: {} of {} callers never returned",
        threads.iter().filter(|t| !t.is_finished()).count(),
        threads.len()
    );
    threads.into_iter().map(|t| t.join()).collect()
}

/// Item 5. Four workers call the batched wrapper through `handle` (so it gathers their calls
/// into one batch, led by one of them); the connections factory panics once, outside any
/// handler. The leader's caller sees the panic, the three others an error, all within the
/// deadline, nothing applied; then the same four messages again are all applied, once.
fn a_connect_that_panics_once_answers_every_caller_of_its_batch(db: &Db) {
    let effects = effects_table(db);
    let panic_once = Arc::new(AtomicBool::new(true));
    let handler = batched_box(
        db,
        store(db),
        &effects,
        (4, Duration::from_secs(5)),
        Some(panic_once.clone()),
        Arc::new(|_| {}),
    );
    let messages: Vec<Message> = (0..4).map(|i| Message::new(format!("{i}"))).collect();
    let round = |what: &str| {
        let threads = messages
            .iter()
            .map(|m| {
                let (h, m) = (handler.clone(), m.clone());
                std::thread::spawn(move || h.handle(&m).map_err(|e| e.to_string()))
            })
            .collect();
        joined(what, threads)
    };
    let first = round("the batch whose connect panicked");
    assert!(!panic_once.load(Ordering::SeqCst), "the factory was called");
    let panicked = first.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        panicked, 1,
        "the leader's own caller sees the panic: {first:?}"
    );
    for r in first.iter().flatten() {
        let e = r.as_ref().expect_err("nothing of the batch was accepted");
        assert!(e.contains("panicked"), "each other caller is told why: {e}");
    }
    assert!(keys(db, &effects).is_empty(), "nothing applied");
    let second = round("the next batch");
    for r in &second {
        assert!(matches!(r, Ok(Ok(Outcome::Accept))), "{second:?}");
    }
    let mut expected: Vec<String> = messages.iter().map(|m| m.id().to_string()).collect();
    expected.sort();
    assert_eq!(keys(db, &effects), expected, "each applied once");
}

on_every_database!(a_connect_that_panics_once_answers_every_caller_of_its_batch);

/// Publishes `n` messages, each with its own `k` header; their ids.
fn publish_keyed(conn: &acemq_amqp::Connection, queue: &str, n: usize) -> Vec<String> {
    let publisher = conn.publisher().unwrap();
    let mut ids: Vec<String> = (0..n)
        .map(|i| {
            let m = Message::new(format!("{i}")).with_header("k", format!("k{i}"));
            let id = m.id().to_string();
            publisher.publish("", queue, m).unwrap();
            id
        })
        .collect();
    ids.sort();
    ids
}

/// Waits until the batched wrapper has committed `n` messages and `queue` is empty.
fn all_committed_and_drained(
    conn: &acemq_amqp::Connection,
    queue: &str,
    commits: &Mutex<Vec<usize>>,
    n: usize,
) {
    assert!(
        eventually(WAIT, || commits.lock().unwrap().iter().sum::<usize>() == n),
        "all {n} committed: {:?}",
        commits.lock().unwrap()
    );
    support::wait_for_count(conn, queue, 0, WAIT);
}

/// The number of callers the batched wrapper counts as its workers (from its `Debug`).
fn workers_of(batch: &dyn Batched) -> usize {
    let debug = format!("{batch:?}");
    let at = debug.find("workers: ").expect("workers in the Debug") + "workers: ".len();
    debug[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("workers in {debug}"))
}

/// A backlog of keyed messages on a consumed queue of the test's own, and the batched wrapper
/// (batches of up to 8) that applies them, its commits recorded.
struct Backlog {
    conn: acemq_amqp::Connection,
    _clean: support::Cleanup,
    q: String,
    effects: String,
    ids: Vec<String>,
    commits: Arc<Mutex<Vec<usize>>>,
    batch: Arc<dyn Batched>,
}

impl Backlog {
    /// `n` keyed messages on a queue named after `prefix`, and the wrapper on `db` (a batch
    /// is what came within `wait`).
    fn new(db: &Db, prefix: &str, n: usize, wait: Duration) -> Self {
        let (conn, _clean, q) = support::declared_consumed_queue(prefix);
        let effects = effects_table(db);
        let ids = publish_keyed(&conn, &q, n);
        let (commits, on_commit) = recorder();
        let batch = batched_box(db, store(db), &effects, (8, wait), None, on_commit);
        Backlog {
            conn,
            _clean,
            q,
            effects,
            ids,
            commits,
            batch,
        }
    }

    /// Consumes the backlog with `handler` under `options` until all of it is committed and the
    /// queue is empty; then asserts each effect was applied once.
    fn consume_all(
        &self,
        db: &Db,
        options: ConsumerOptions,
        handler: impl Handler + Send + Sync + 'static,
    ) {
        let consumer = self
            .conn
            .consumer(&self.q, options)
            .unwrap()
            .start(handler)
            .unwrap();
        all_committed_and_drained(&self.conn, &self.q, &self.commits, self.ids.len());
        consumer.close().unwrap();
        assert_eq!(keys(db, &self.effects), self.ids, "each effect once");
    }
}

/// Item 6. The batched wrapper inside every layer of the chain (logging, a deadline, the
/// idempotency guard, ordering), handed to a consumer with one worker: the worker still
/// gathers batches (some commit holds more than one message), each effect applied once, all
/// acknowledged.
#[test]
fn a_chained_batched_handler_gets_batches_from_the_consumer() {
    let db = Db::postgres();
    let backlog = Backlog::new(&db, "idem-chain-batch", 48, Duration::from_millis(200));
    let handler = chain(
        backlog.batch.clone(),
        [
            with_logging(),
            with_timeout(Duration::from_secs(20)).unwrap(),
            with_idempotency(InMemoryIdempotencyStore::default()),
            with_ordering(by_header("k")),
        ],
    );
    assert_eq!(
        handler.batch_limits(),
        Some((8, Duration::from_millis(200))),
        "the chain passes the batch limits on"
    );
    let options = ConsumerOptions::new().concurrency(1).prefetch(32);
    backlog.consume_all(&db, options, handler);
    let (conn, q) = (&backlog.conn, &backlog.q);
    assert_eq!(conn.queue_info(q).unwrap().message_count, 0, "all acked");
    let commits = backlog.commits.lock().unwrap().clone();
    assert!(
        commits.iter().any(|&n| n > 1),
        "the worker gathered batches through the chain: {commits:?}"
    );
}

/// Item 6. The batched wrapper under a deadline, hidden from the consumer behind a closure (so
/// it gathers the calls of concurrent callers, each on a fresh deadline thread): what it counts
/// as its workers stays bounded by the callers that really run at once, not one per message.
#[test]
fn batching_behind_a_deadline_counts_its_callers_not_its_threads() {
    let db = Db::sqlite();
    let backlog = Backlog::new(&db, "idem-batch-threads", 40, Duration::from_millis(100));
    let chained = chain(
        backlog.batch.clone(),
        [with_timeout(Duration::from_secs(20)).unwrap()],
    );
    let options = ConsumerOptions::new().concurrency(2).prefetch(16);
    backlog.consume_all(&db, options, move |m: &Message| chained.handle(m));
    let workers = workers_of(&*backlog.batch);
    assert!(
        workers <= 2,
        "two callers at most at once, counted as {workers} workers"
    );
}

/// A layer that records each message's attempt and outcome label as it leaves the layers
/// inside it.
fn outcomes(seen: Arc<Mutex<Vec<(u32, String)>>>) -> Layer {
    struct Rec {
        seen: Arc<Mutex<Vec<(u32, String)>>>,
        inner: BoxHandler,
    }
    impl Handler for Rec {
        fn handle(&self, m: &Message) -> HandlerResult {
            let r = self.inner.handle(m);
            let label = match &r {
                Ok(o) => o.label().to_string(),
                Err(e) => format!("error: {e}"),
            };
            self.seen.lock().unwrap().push((m.envelope.attempt, label));
            r
        }
    }
    Layer::new(move |inner| Box::new(Rec { seen, inner }))
}

/// What item 11's scenario saw: each start of the user's handler (attempt, when), when the
/// first run's late end came, and the effects applied.
#[derive(Default)]
struct Runs {
    starts: Mutex<Vec<(u32, Instant)>>,
    orphan_ended: Mutex<Option<Instant>>,
    effects: Mutex<Vec<String>>,
}

/// `with_idempotency` **outside** `with_timeout`: attempt 1 is stuck past the deadline (200
/// ms) until the test lets it go, then accepts (`late_outcome_accepts`) or fails; the retry
/// (attempt 2) is handled meanwhile. Returns what ran, once the message is settled, having
/// asserted that the effect was applied once.
fn overrun_under_idempotency(
    store: impl IdempotencyStore + 'static,
    late_outcome_accepts: bool,
) -> Arc<Runs> {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-orphan");
    let runs = Arc::new(Runs::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (let_go, gate) = crossbeam_channel::bounded::<()>(1);
    let r = runs.clone();
    let handler = chain(
        move |m: &Message| -> HandlerResult {
            r.starts
                .lock()
                .unwrap()
                .push((m.envelope.attempt, Instant::now()));
            if m.envelope.attempt == 1 {
                let _ = gate.recv_timeout(WAIT);
                *r.orphan_ended.lock().unwrap() = Some(Instant::now());
                if !late_outcome_accepts {
                    return Err("the first run failed, late".into());
                }
            }
            r.effects.lock().unwrap().push(m.id().to_string());
            Ok(Outcome::Accept)
        },
        [
            outcomes(seen.clone()),
            with_idempotency(store),
            with_timeout(Duration::from_millis(200)).unwrap(),
        ],
    );
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .retry(RetryPolicy::fixed(5, Duration::from_millis(100)).jitter(0.0)),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    let m = Message::new("charge");
    let id = m.id().to_string();
    conn.publisher().unwrap().publish("", &q, m).unwrap();
    assert!(
        eventually(WAIT, || seen.lock().unwrap().iter().any(|(a, _)| *a == 2)),
        "the overrun's retry was handled: {:?}",
        seen.lock().unwrap()
    );
    let_go.send(()).unwrap();
    assert!(
        eventually(WAIT, || seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, o)| o == "accept")),
        "the message was accepted in the end: {:?}",
        seen.lock().unwrap()
    );
    support::wait_for_count(&conn, &q, 0, WAIT);
    consumer.close().unwrap();
    assert_eq!(
        *runs.effects.lock().unwrap(),
        vec![id],
        "the effect applied once"
    );
    runs
}

/// Asserts the handler ran twice, the retry only once the orphan (the first run) had ended.
fn assert_the_retry_ran_after_the_orphan(runs: &Runs) {
    let ended = runs.orphan_ended.lock().unwrap().expect("the orphan ended");
    let starts = runs.starts.lock().unwrap();
    assert_eq!(starts.len(), 2, "the first run and one more: {starts:?}");
    assert!(
        starts[1].1 >= ended,
        "the retry ran beside the orphan: started {:?} before it ended",
        ended - starts[1].1
    );
}

/// Item 11 (the order made safe): the retry of an overrun finds the key in progress while the
/// orphan works; the orphan's accept confirms the claim; the retry is then a duplicate. The
/// effect is applied once, by the orphan alone.
#[test]
fn idempotency_outside_a_deadline_holds_the_claim_until_the_orphan_ends() {
    let runs = overrun_under_idempotency(InMemoryIdempotencyStore::default(), true);
    let starts = runs.starts.lock().unwrap();
    assert_eq!(
        starts.len(),
        1,
        "the handler ran once, as the orphan: {starts:?}"
    );
}

/// Item 11: an orphan that fails gives its claim back only when it ends; the retry runs after
/// it, never beside it, and applies the effect once.
#[test]
fn an_orphan_that_fails_gives_its_claim_back_only_when_it_has_ended() {
    let runs = overrun_under_idempotency(InMemoryIdempotencyStore::default(), false);
    assert_the_retry_ran_after_the_orphan(&runs);
}

/// A store with `first_time` only (no claims): it cannot tell work in progress from work
/// done, so the wrapper itself keeps the key in progress while the orphan runs.
#[derive(Default)]
struct FirstTimeOnly(Mutex<std::collections::HashSet<String>>);

impl IdempotencyStore for FirstTimeOnly {
    fn first_time(&self, key: &str) -> acemq_amqp::Result<bool> {
        Ok(self.0.lock().unwrap().insert(key.to_string()))
    }
    fn forget(&self, key: &str) -> acemq_amqp::Result<()> {
        self.0.lock().unwrap().remove(key);
        Ok(())
    }
}

/// Item 11, over a store without claims: the retry is not taken for a duplicate while the
/// orphan runs, nor run beside it; the orphan's failure gives the key back when it ends, and
/// the retry applies the effect once.
#[test]
fn a_store_without_claims_keeps_an_orphans_key_in_progress_until_it_ends() {
    let runs = overrun_under_idempotency(FirstTimeOnly::default(), false);
    assert_the_retry_ran_after_the_orphan(&runs);
}

/// Items 6 and 11 together: a batched handler under a deadline, inside the idempotency layer,
/// handed to the consumer through the chain. Its first batches (attempt 1) are stuck past the
/// deadline until the test lets them go: every message of them is retried on time, and each
/// message's claim is held until the orphaned batch has ended, so the retries are in progress
/// meanwhile and then duplicates: each effect applied once, by the orphans.
#[test]
fn an_overrun_batch_holds_each_messages_claim_until_its_orphan_ends() {
    #[derive(Default)]
    struct Settled(Mutex<Vec<(u32, String, String)>>);
    impl acemq_amqp::observe::Observer for Settled {
        fn settled(&self, s: &acemq_amqp::observe::Settlement<'_>) {
            self.0.lock().unwrap().push((
                s.attempt,
                s.outcome.to_string(),
                s.message_id.to_string(),
            ));
        }
    }
    struct Gated {
        gate: crossbeam_channel::Receiver<()>,
        effects: Arc<Mutex<Vec<String>>>,
        batches: Arc<Mutex<Vec<Vec<u32>>>>,
    }
    impl Handler for Gated {
        fn handle(&self, m: &Message) -> HandlerResult {
            match self.handle_batch(&[m]).pop() {
                Some(Ok(result)) => result,
                _ => Err("no result".into()),
            }
        }
        fn batch_limits(&self) -> Option<(usize, Duration)> {
            Some((4, Duration::from_millis(300)))
        }
        fn handle_batch(&self, ms: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
            let attempts: Vec<u32> = ms.iter().map(|m| m.envelope.attempt).collect();
            self.batches.lock().unwrap().push(attempts.clone());
            if attempts.contains(&1) {
                // Until the test drops the sender.
                let _ = self.gate.recv_timeout(WAIT);
            }
            let mut effects = self.effects.lock().unwrap();
            effects.extend(ms.iter().map(|m| m.id().to_string()));
            ms.iter().map(|_| Ok(Ok(Outcome::Accept))).collect()
        }
    }
    let settled = Arc::new(Settled::default());
    let conn = support::connect_with(
        acemq_amqp::ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(settled.clone()),
    );
    let (_clean, q) = support::consumed_queue_on(&conn, "idem-orphan-batch", |spec| spec);
    let ids = publish_keyed(&conn, &q, 4);
    let (let_go, gate) = crossbeam_channel::bounded::<()>(0);
    let (effects, batches) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let handler = chain(
        Gated {
            gate,
            effects: effects.clone(),
            batches: batches.clone(),
        },
        [
            with_idempotency(InMemoryIdempotencyStore::default()),
            with_timeout(Duration::from_millis(200)).unwrap(),
        ],
    );
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .prefetch(8)
                .retry(RetryPolicy::fixed(5, Duration::from_millis(100)).jitter(0.0)),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    let of = |attempt: u32, outcome: &str| {
        let seen = settled.0.lock().unwrap();
        let mut ids: Vec<String> = seen
            .iter()
            .filter(|(a, o, _)| *a == attempt && o == outcome)
            .map(|(_, _, id)| id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids.len()
    };
    assert!(
        eventually(WAIT, || of(1, "retry") == 4),
        "every message of the overrun batches retried: {:?}",
        settled.0.lock().unwrap()
    );
    assert!(
        eventually(WAIT, || settled
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|(a, _, _)| *a == 2)),
        "a retry was handled while the orphans ran"
    );
    drop(let_go);
    assert!(
        eventually(WAIT, || of(2, "accept") == 4),
        "every message accepted in the end: {:?}",
        settled.0.lock().unwrap()
    );
    support::wait_for_count(&conn, &q, 0, WAIT);
    consumer.close().unwrap();
    let mut applied = effects.lock().unwrap().clone();
    applied.sort();
    assert_eq!(
        applied,
        ids,
        "each effect once; batches: {:?}",
        batches.lock().unwrap()
    );
}
