//! The family's metric words (`tests/fixtures/metric_words.json`, read from Java's
//! `MetricNames`, Go's `amqp/telemetry.go` and Python's `tests/test_telemetry.py`) as
//! `MetricsObserver` emits them on the real broker. One recorder of this file's own is the
//! process's (consumer threads are other threads: a thread-local recorder would not see them);
//! each test reads only the series labelled with its own unique queue, exchange or pipeline, and
//! every test checks that everything emitted so far, by any test, is in the fixture.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq_amqp::observe::MetricsObserver;
use acemq_amqp::patterns::outbox::{
    record_message, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions,
};
use acemq_amqp::patterns::pipeline::{then, Next, NOTHING};
use acemq_amqp::{
    Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec, RetryPolicy,
};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use support::{eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The recorder.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One series: a counter's total, a gauge's value, a histogram's samples.
#[derive(Default)]
struct Cell {
    value: Mutex<f64>,
    samples: Mutex<Vec<f64>>,
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        *self.value.lock().unwrap() += value as f64;
    }
    fn absolute(&self, value: u64) {
        *self.value.lock().unwrap() = value as f64;
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        *self.value.lock().unwrap() += value;
    }
    fn decrement(&self, value: f64) {
        *self.value.lock().unwrap() -= value;
    }
    fn set(&self, value: f64) {
        *self.value.lock().unwrap() = value;
    }
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        self.samples.lock().unwrap().push(value);
    }
}

type Labels = BTreeMap<String, String>;
type SeriesKey = (Kind, String, Labels);

#[derive(Default)]
struct Recording {
    series: Mutex<BTreeMap<SeriesKey, Arc<Cell>>>,
}

impl Recording {
    fn cell(&self, kind: Kind, key: &Key) -> Arc<Cell> {
        let labels = key
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        self.series
            .lock()
            .unwrap()
            .entry((kind, key.name().to_string(), labels))
            .or_default()
            .clone()
    }

    /// The series of `name` whose labels include every pair of `with`.
    fn find(&self, name: &str, with: &[(&str, &str)]) -> Vec<(Kind, Labels, f64, Vec<f64>)> {
        self.series
            .lock()
            .unwrap()
            .iter()
            .filter(|((_, n, labels), _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|((kind, _, labels), cell)| {
                (
                    *kind,
                    labels.clone(),
                    *cell.value.lock().unwrap(),
                    cell.samples.lock().unwrap().clone(),
                )
            })
            .collect()
    }

    /// A counter's or gauge's value (0 when never recorded), summed over its series with `with`.
    fn value(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.find(name, with).iter().map(|s| s.2).sum()
    }

    /// A histogram's samples over its series with `with`.
    fn samples(&self, name: &str, with: &[(&str, &str)]) -> Vec<f64> {
        self.find(name, with)
            .into_iter()
            .flat_map(|s| s.3)
            .collect()
    }
}

struct Shared(Arc<Recording>);

impl Recorder for Shared {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.cell(Kind::Counter, key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.0.cell(Kind::Gauge, key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.cell(Kind::Histogram, key))
    }
}

/// The process's recorder, installed once.
fn recording() -> &'static Arc<Recording> {
    static RECORDING: OnceLock<Arc<Recording>> = OnceLock::new();
    RECORDING.get_or_init(|| {
        let recording = Arc::new(Recording::default());
        metrics::set_global_recorder(Shared(recording.clone()))
            .expect("this test binary installs the only recorder");
        recording
    })
}

// ---------------------------------------------------------------------------------------------
// The fixture.

/// What a metric may carry: its kind and, per label key, `None` (any value) or the values.
struct Word {
    kind: String,
    labels: BTreeMap<String, Option<BTreeSet<String>>>,
}

/// The family's words and this crate's own, merged: name → kind and allowed label values.
fn words() -> &'static BTreeMap<String, Word> {
    static WORDS: OnceLock<BTreeMap<String, Word>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let text = include_str!("fixtures/metric_words.json");
        let fixture: serde_json::Value = serde_json::from_str(text).expect("the fixture is JSON");
        let mut words = BTreeMap::new();
        let labels_of = |entry: &serde_json::Value| {
            entry["labels"]
                .as_object()
                .expect("labels")
                .iter()
                .map(|(k, v)| {
                    let values = v.as_array().map(|vs| {
                        vs.iter()
                            .map(|v| v.as_str().expect("a label value").to_string())
                            .collect()
                    });
                    if values.is_none() {
                        assert_eq!(v, "any", "{k}: a list of values or \"any\"");
                    }
                    (k.clone(), values)
                })
                .collect()
        };
        for entry in fixture["metrics"].as_array().expect("metrics") {
            assert!(
                entry["source"].as_str().is_some_and(|s| !s.is_empty()),
                "every family word names its source: {entry}"
            );
            let name = entry["name"].as_str().expect("name").to_string();
            let word = Word {
                kind: entry["kind"].as_str().expect("kind").to_string(),
                labels: labels_of(entry),
            };
            assert!(words.insert(name, word).is_none(), "listed once");
        }
        for entry in fixture["ours"].as_array().expect("ours") {
            assert!(
                entry["why"].as_str().is_some_and(|s| !s.is_empty()),
                "every word of ours says why: {entry}"
            );
            let name = entry["name"].as_str().expect("name").to_string();
            if let Some(label) = entry["label"].as_str() {
                let word = words
                    .get_mut(&name)
                    .unwrap_or_else(|| panic!("{name}: extra values for a family metric"));
                let allowed = word
                    .labels
                    .get_mut(label)
                    .unwrap_or_else(|| panic!("{name}: no label {label}"))
                    .as_mut()
                    .unwrap_or_else(|| panic!("{name}.{label} takes any value already"));
                for v in entry["values"].as_array().expect("values") {
                    allowed.insert(v.as_str().expect("value").to_string());
                }
            } else {
                let word = Word {
                    kind: entry["kind"].as_str().expect("kind").to_string(),
                    labels: labels_of(entry),
                };
                assert!(words.insert(name, word).is_none(), "listed once");
            }
        }
        words
    })
}

/// Every series recorded so far (by any test of this binary) is a word of the fixture: its
/// name, its kind, exactly its label keys, and a value each label allows.
fn everything_emitted_is_in_the_fixture() {
    let words = words();
    for (kind, name, labels) in recording().series.lock().unwrap().keys() {
        let word = words
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a word of the fixture"));
        assert_eq!(word.kind, kind.as_str(), "{name}'s kind");
        let keys: BTreeSet<&String> = labels.keys().collect();
        let wanted: BTreeSet<&String> = word.labels.keys().collect();
        assert_eq!(keys, wanted, "{name}'s label keys");
        for (k, v) in labels {
            if let Some(Some(allowed)) = word.labels.get(k) {
                assert!(
                    allowed.contains(v),
                    "{name}{{{k}={v:?}}}: not a word of the fixture"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The broker.

fn connect() -> Connection {
    recording();
    support::connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(MetricsObserver::new()),
    )
}

/// Declares `q` (classic) and starts a consumer of it whose handler answers with
/// `answer(attempt)`; counts its calls.
fn consume(
    conn: &Connection,
    q: &str,
    options: ConsumerOptions,
    answer: impl Fn(u32) -> Outcome + Send + Sync + 'static,
) -> (acemq_amqp::RunningConsumer, Arc<AtomicUsize>) {
    conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let running = conn
        .consumer(q, options)
        .unwrap()
        .start(move |m: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<_, acemq_amqp::BoxError>(answer(m.envelope.attempt))
        })
        .unwrap();
    (running, calls)
}

/// Waits (within the deadline) until the value of `name` with `labels` is `value`.
fn wait_for(name: &str, labels: &[(&str, &str)], value: f64) {
    let rec = recording();
    assert!(
        eventually(WAIT, || rec.value(name, labels) == value),
        "{name} {labels:?} is {}, not {value}",
        rec.value(name, labels)
    );
}

/// Waits (within the deadline) until the value of `name` with `labels` is at least `value`.
fn wait_for_at_least(name: &str, labels: &[(&str, &str)], value: f64) {
    let rec = recording();
    assert!(
        eventually(WAIT, || rec.value(name, labels) >= value),
        "{name} {labels:?} is {}, under {value}",
        rec.value(name, labels)
    );
}

/// Waits (within the deadline) until `acemq.consume.total` of `q` with `outcome` is `value`.
fn wait_consumed(q: &str, outcome: &str, value: f64) {
    wait_for(
        "acemq.consume.total",
        &[("queue", q), ("outcome", outcome)],
        value,
    );
}

/// `acemq.consume.total` of `q` with `outcome`, now.
fn consumed(q: &str, outcome: &str) -> f64 {
    recording().value("acemq.consume.total", &[("queue", q), ("outcome", outcome)])
}

/// `acemq.messages.retried.total` of `q` retried where `place`, now.
fn retried(q: &str, place: &str) -> f64 {
    recording().value(
        "acemq.messages.retried.total",
        &[("queue", q), ("where", place)],
    )
}

/// A handler's answer by attempt: a retry (for `reason`) at the first, accepted after.
fn retry_once(reason: &'static str) -> impl Fn(u32) -> Outcome + Send + Sync + 'static {
    move |attempt| match attempt {
        1 => Outcome::retry(reason),
        _ => Outcome::Accept,
    }
}

/// A connection ([`connect`]), its clean-up, and the name of a consumed queue of the test's own
/// named after `prefix`, its rungs `rungs` cleaned up too (not declared).
fn consumed_queue(prefix: &str, rungs: &[Duration]) -> (Connection, Cleanup, String) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique(prefix), rungs);
    (conn, clean, q)
}

/// The value of `name` with `labels` is `value` now.
fn assert_value(name: &str, labels: &[(&str, &str)], value: f64) {
    assert_eq!(recording().value(name, labels), value, "{name} {labels:?}");
}

/// Publishes `body` to `q` through the default exchange.
fn send(conn: &Connection, q: &str, body: &str) {
    conn.publisher()
        .unwrap()
        .publish("", q, Message::new(body))
        .unwrap();
}

/// Closes the consumer, checks that every word emitted is in the fixture, closes the connection.
fn finish(running: acemq_amqp::RunningConsumer, conn: Connection) {
    running.close().unwrap();
    everything_emitted_is_in_the_fixture();
    conn.close().unwrap();
}

#[test]
fn an_accepted_delivery_counts_acked_its_attempt_and_in_flight_and_its_publish_is_timed() {
    let (conn, _clean, q) = consumed_queue("words-accept", &[]);
    let publisher = conn.publisher().unwrap();
    let (running, calls) = consume(&conn, &q, ConsumerOptions::new(), |_| Outcome::Accept);
    publisher.publish("", &q, Message::new("ok")).unwrap();
    let rec = recording();
    let queue = [("queue", q.as_str())];
    wait_consumed(&q, "acked", 1.0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(rec.samples("acemq.consume.attempts", &queue), vec![1.0]);
    assert_eq!(rec.samples("acemq.consume.duration", &queue).len(), 1);
    // Up to one on the way in, back to none once settled.
    assert!(eventually(WAIT, || rec
        .find("acemq.consume.in.flight", &queue)
        .len()
        == 1
        && rec.value("acemq.consume.in.flight", &queue) == 0.0));
    let published = [
        ("exchange", ""),
        ("routing.key", q.as_str()),
        ("outcome", "confirmed"),
    ];
    // The confirm's event comes from the confirm thread, which may answer after the
    // consumer has settled the message: waited for.
    assert!(eventually(WAIT, || rec
        .value("acemq.publish.total", &published)
        == 1.0));
    let took = rec.samples("acemq.publish.duration", &published);
    assert_eq!(took.len(), 1, "one publish, timed to its confirm");
    assert!(
        took[0] > 0.0 && took[0] < WAIT.as_secs_f64(),
        "{took:?} seconds"
    );
    publisher.close().unwrap();
    finish(running, conn);
}

#[test]
fn a_retry_on_a_rung_is_retried_where_broker() {
    let rung = Duration::from_secs(1);
    let (conn, _clean, q) = consumed_queue("words-rung", &[rung]);
    let policy = RetryPolicy::fixed(3, rung).broker_wait_threshold(rung);
    let options = ConsumerOptions::new().retry(policy);
    let answer = retry_once("the warehouse is not answering");
    let (running, _) = consume(&conn, &q, options, answer);
    send(&conn, &q, "later");
    let rec = recording();
    wait_consumed(&q, "acked", 1.0);
    assert_eq!(retried(&q, "broker"), 1.0, "waited on {q}.retry.1s");
    assert_eq!(retried(&q, "consumer"), 0.0);
    assert_eq!(consumed(&q, "retried"), 1.0);
    assert_eq!(
        rec.samples("acemq.consume.attempts", &[("queue", &q)]),
        vec![1.0, 2.0],
        "each delivery's attempt, on the way in"
    );
    assert_eq!(
        rec.find("acemq.retry.rung.missing", &[("queue", &q)]).len(),
        0
    );
    finish(running, conn);
}

#[test]
fn a_retry_held_in_the_consumer_is_retried_where_consumer() {
    let (conn, _clean, q) = consumed_queue("words-held", &[]);
    // Shorter than the (default, 30 s) broker threshold: held in the consumer.
    let options = ConsumerOptions::new().retry(RetryPolicy::fixed(3, Duration::from_millis(50)));
    let (running, _) = consume(&conn, &q, options, retry_once("not yet"));
    send(&conn, &q, "soon");
    wait_consumed(&q, "acked", 1.0);
    assert_eq!(retried(&q, "consumer"), 1.0);
    assert_eq!(retried(&q, "broker"), 0.0);
    finish(running, conn);
}

#[test]
fn retries_exhausted_are_dead_lettered_not_rejected() {
    let (conn, _clean, q) = consumed_queue("words-exhausted", &[]);
    let options = ConsumerOptions::new().retry(RetryPolicy::fixed(2, Duration::ZERO));
    let (running, calls) = consume(&conn, &q, options, |_| Outcome::retry("still down"));
    send(&conn, &q, "doomed");
    assert!(eventually(WAIT, || consumed(&q, "dead_lettered") == 1.0));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "both attempts ran");
    assert_eq!(consumed(&q, "retried"), 1.0);
    assert_eq!(
        consumed(&q, "rejected"),
        0.0,
        "the consumer gave up, not the handler"
    );
    // Recorded just after the settlement's own count, from the same event: waited for too.
    wait_for(
        "acemq.messages.dead.lettered.total",
        &[("queue", &q), ("outcome", "dead_lettered")],
        1.0,
    );
    // A retry with no wait goes straight back to the queue: not a rung.
    assert_eq!(retried(&q, "consumer"), 1.0);
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        1
    );
    finish(running, conn);
}

#[test]
fn the_handlers_own_reject_is_rejected_and_dead_lettered() {
    let (conn, _clean, q) = consumed_queue("words-reject", &[]);
    let (running, _) = consume(&conn, &q, ConsumerOptions::new(), |_| {
        Outcome::reject("no such customer")
    });
    send(&conn, &q, "who?");
    wait_consumed(&q, "rejected", 1.0);
    assert_value(
        "acemq.messages.dead.lettered.total",
        &[("queue", &q), ("outcome", "dead_lettered")],
        1.0,
    );
    finish(running, conn);
}

#[test]
fn a_missing_rung_is_counted_and_the_retry_waits_in_the_consumer() {
    let rung = Duration::from_secs(1);
    let (conn, _clean, q) = consumed_queue("words-no-rung", &[rung]);
    // The queue and its .dlq, but no rung: the consumer is told not to declare its topology.
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let policy = RetryPolicy::fixed(3, rung).broker_wait_threshold(rung);
    let options = ConsumerOptions::new().retry(policy).declare(false);
    let answer = retry_once("the warehouse is not answering");
    let (running, _) = consume(&conn, &q, options, answer);
    send(&conn, &q, "no ladder");
    wait_consumed(&q, "acked", 1.0);
    let rung_queue = acemq_amqp::retry_queue(&q, rung);
    assert_value(
        "acemq.retry.rung.missing",
        &[("queue", &q), ("rung", &rung_queue)],
        1.0,
    );
    assert_eq!(retried(&q, "consumer"), 1.0);
    assert_eq!(retried(&q, "broker"), 0.0);
    finish(running, conn);
}

#[test]
fn a_dead_letter_queue_that_is_missing_counts_set_aside_failed() {
    let conn = connect();
    let (_clean, q) = support::consumed_queue_on(&conn, "words-no-dlq", QueueSpec::classic);
    let options = ConsumerOptions::new().declare(false);
    let (running, _) = consume(&conn, &q, options, |_| Outcome::reject("unreadable"));
    send(&conn, &q, "nowhere to go");
    let dlq = acemq_amqp::dead_letter_queue(&q);
    wait_for_at_least(
        "acemq.messages.set.aside.failed",
        &[("queue", &q), ("target", &dlq)],
        1.0,
    );
    // The settlement is counted after the failed copy's event: waited for too.
    assert!(
        eventually(WAIT, || consumed(&q, "copy_failed") >= 1.0),
        "the original goes back to the queue"
    );
    finish(running, conn);
}

#[test]
fn pipeline_runs_are_counted_completed_and_ended_early_at_their_named_steps() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let input = clean.consumed_queue(&unique("words-then-in"), &[]);
    let output = clean.consumed_queue(&unique("words-then-out"), &[]);
    conn.declare_queue(&QueueSpec::new(&input).classic())
        .unwrap();
    conn.declare_queue(&QueueSpec::new(&output).classic())
        .unwrap();
    let pipeline = unique("orders");
    // The last step publishes what is not digital onwards; a digital order ends the run early
    // — here, at the last step too, so it counts completed only when it published.
    let step = then(
        conn.publisher().unwrap(),
        "",
        output.clone(),
        |m: &Message| {
            if m.body == b"digital" {
                Ok(NOTHING)
            } else {
                Ok(Next::Publish(serde_json::json!({ "ship": true })))
            }
        },
    )
    .named(&pipeline, "validate");
    let stepping = conn.consume(&input, step).unwrap();
    let last = then(
        conn.publisher().unwrap(),
        "",
        output.clone(),
        |_: &Message| Ok(NOTHING),
    )
    .named(&pipeline, "ship")
    .last();
    let shipping = conn.consume(&output, last).unwrap();
    let publisher = conn.publisher().unwrap();
    publisher
        .publish("", &input, Message::new("boxed"))
        .unwrap();
    publisher
        .publish("", &input, Message::new("digital"))
        .unwrap();
    let rec = recording();
    let runs = |step, outcome| {
        rec.value(
            "acemq.pipeline.run.total",
            &[
                ("pipeline", &pipeline),
                ("step", step),
                ("outcome", outcome),
            ],
        )
    };
    assert!(eventually(WAIT, || runs("ship", "completed") == 1.0
        && runs("validate", "ended_early") == 1.0));
    assert_eq!(runs("validate", "completed"), 0.0, "not the last step");
    let took = rec.samples("acemq.pipeline.run.duration", &[("pipeline", &pipeline)]);
    assert_eq!(took.len(), 2);
    assert!(
        took.iter().all(|s| *s >= 0.0 && *s < WAIT.as_secs_f64()),
        "{took:?}"
    );
    stepping.close().unwrap();
    publisher.close().unwrap();
    finish(shipping, conn);
}

#[test]
fn an_outbox_relay_counts_each_record_by_exchange_and_routing_key() {
    let conn = connect();
    let (_clean, q) = support::consumed_queue_on(&conn, "words-outbox", QueueSpec::classic);
    let store = InMemoryOutboxStore::new();
    store
        .add(&record_message("", &q, &Message::new("from the outbox")).unwrap())
        .unwrap();
    let relay = OutboxRelay::new(&conn, store, OutboxRelayOptions::new()).unwrap();
    assert_eq!(relay.sweep().unwrap(), 1);
    relay.close().unwrap();
    let rec = recording();
    let record = [("exchange", ""), ("routing.key", q.as_str())];
    assert_value(
        "acemq.outbox.total",
        &[record[0], record[1], ("outcome", "published")],
        1.0,
    );
    // The lag carries `outcome="published"`, as Go's and Python's do.
    assert_eq!(
        rec.samples(
            "acemq.outbox.lag",
            &[record[0], record[1], ("outcome", "published")]
        )
        .len(),
        1
    );
    everything_emitted_is_in_the_fixture();
    conn.close().unwrap();
}

/// A retry whose copy cannot be published (the in-process broker nacks it: the real one cannot
/// be made to refuse one publish on demand) goes back on its queue as it was, after a pause: the
/// family's `retried{where="requeued"}` (Python's, for a republish that failed), and the
/// message still gets its next attempt.
#[test]
fn a_retry_whose_copy_cannot_be_published_is_retried_where_requeued() {
    recording();
    let broker = acemq_amqp::testing::MemoryBroker::named(&unique("words-requeued"));
    let conn = support::connect_with(
        ConnectionOptions::new()
            .address(broker.url())
            .observer(MetricsObserver::new()),
    );
    let q = unique("words-requeued");
    let options = ConsumerOptions::new().retry(RetryPolicy::fixed(3, Duration::from_millis(10)));
    let (running, calls) = consume(&conn, &q, options, retry_once("not yet"));
    // The message, then its first retry copy, are nacked.
    send(&conn, &q, "soon");
    broker.nack_next_publishes(1);
    wait_consumed(&q, "acked", 1.0);
    assert_eq!(retried(&q, "requeued"), 1.0, "the failed copy");
    assert_eq!(retried(&q, "consumer"), 2.0, "both tries at the retry");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "attempt 1 twice, then attempt 2"
    );
    finish(running, conn);
}

/// The fixture itself: every name the issue asks for is a family word there, with the family's
/// label keys.
#[test]
fn the_fixture_holds_the_words_the_issue_names() {
    let words = words();
    for (name, keys) in [
        ("acemq.consume.total", &["queue", "outcome"][..]),
        ("acemq.consume.attempts", &["queue"]),
        ("acemq.consume.in.flight", &["queue"]),
        ("acemq.messages.retried.total", &["queue", "where"]),
        (
            "acemq.publish.duration",
            &["exchange", "routing.key", "outcome"],
        ),
        ("acemq.retry.rung.missing", &["queue", "rung"]),
        ("acemq.messages.set.aside.failed", &["queue", "target"]),
        ("acemq.pipeline.run.total", &["pipeline", "step", "outcome"]),
        (
            "acemq.pipeline.run.duration",
            &["pipeline", "step", "outcome"],
        ),
        (
            "acemq.outbox.total",
            &["exchange", "routing.key", "outcome"],
        ),
    ] {
        let word = words.get(name).unwrap_or_else(|| panic!("{name}"));
        let got: Vec<&str> = word.labels.keys().map(String::as_str).collect();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{name}");
    }
    let outcomes = words["acemq.consume.total"].labels["outcome"]
        .as_ref()
        .unwrap();
    assert!(outcomes.contains("dead_lettered") && outcomes.contains("retried"));
    let places = words["acemq.messages.retried.total"].labels["where"]
        .as_ref()
        .unwrap();
    assert_eq!(
        places.iter().map(String::as_str).collect::<Vec<_>>(),
        ["broker", "consumer", "requeued"]
    );
}
