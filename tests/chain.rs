//! The handler chain: layer order, the deadline (overrun → retry on time, orphans counted and
//! bounded), logging without payloads — on the real broker where a consumer is involved.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Overrun;
use acemq_amqp::patterns::chain::{
    chain, with_idempotency, with_logging, with_ordering, with_timeout, BoxHandler, Deadline,
    DeadlineOptions, Layer,
};
use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
use acemq_amqp::patterns::ordering::by_header;
use acemq_amqp::{ConsumerOptions, Handler, Message, Outcome, RetryPolicy};
use support::{eventually, unique};

const WAIT: Duration = Duration::from_secs(30);

/// A layer that records entering and leaving under `name`.
fn recording(name: &'static str, log: Arc<Mutex<Vec<String>>>) -> Layer {
    struct Rec {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        inner: BoxHandler,
    }
    impl Handler for Rec {
        fn handle(&self, m: &Message) -> acemq_amqp::HandlerResult {
            self.log.lock().unwrap().push(format!("{}>", self.name));
            let r = self.inner.handle(m);
            self.log.lock().unwrap().push(format!("<{}", self.name));
            r
        }
        fn ordering(&self) -> Option<&acemq_amqp::OrderBy> {
            self.inner.ordering()
        }
    }
    Layer::new(move |inner| Box::new(Rec { name, log, inner }))
}

#[test]
fn layers_run_outermost_first_and_pass_the_ordering_on() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let handler = chain(
        move |_: &Message| {
            l.lock().unwrap().push("handler".into());
            Ok(Outcome::Accept)
        },
        [
            recording("a", log.clone()),
            recording("b", log.clone()),
            with_ordering(by_header("k")),
            recording("c", log.clone()),
        ],
    );
    assert!(
        handler.ordering().is_some(),
        "the ordering inside the chain reaches the consumer"
    );
    assert_eq!(handler.handle(&Message::new("x")).unwrap(), Outcome::Accept);
    assert_eq!(
        *log.lock().unwrap(),
        vec!["a>", "b>", "c>", "handler", "<c", "<b", "<a"]
    );
    // Through a consumer too: one key, concurrency 4, still one at a time and in order.
    let (conn, _clean, q) = support::declared_consumed_queue("chain-order");
    let publisher = conn.publisher().unwrap();
    for i in 0..30 {
        publisher
            .publish("", &q, Message::new(i.to_string()).with_header("k", "same"))
            .unwrap();
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (s, r, o) = (seen.clone(), running.clone(), overlaps.clone());
    let handler = chain(
        move |m: &Message| {
            if r.fetch_add(1, Ordering::SeqCst) > 0 {
                o.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(2));
            s.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&m.body).parse::<usize>().unwrap());
            r.fetch_sub(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        },
        [with_logging(), with_ordering(by_header("k"))],
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(4).prefetch(50))
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 30));
    consumer.close().unwrap();
    assert_eq!(*seen.lock().unwrap(), (0..30).collect::<Vec<_>>());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[derive(Default)]
struct Overruns(Mutex<Vec<(String, usize, u64)>>);
impl Observer for Overruns {
    fn overrun(&self, o: &Overrun<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((o.message_id.to_string(), o.orphans, o.total));
    }
}

#[test]
fn an_overrun_is_settled_as_a_retry_on_time_and_its_orphan_is_counted() {
    let (conn, _clean, q) = support::declared_consumed_queue("chain-timeout");
    let overruns = Arc::new(Overruns::default());
    let deadline = Deadline::new(
        Duration::from_millis(200),
        DeadlineOptions::default().observer(overruns.clone()),
    )
    .unwrap();
    let orphans = deadline.orphans();
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let s = starts.clone();
    let handler = chain(
        move |m: &Message| {
            s.lock().unwrap().push((m.envelope.attempt, Instant::now()));
            if m.envelope.attempt == 1 {
                // Stuck until the test lets it go: it overruns the deadline.
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
            }
            Ok(Outcome::Accept)
        },
        [with_logging(), deadline.layer()],
    );
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(2)
                .retry(RetryPolicy::fixed(3, Duration::from_millis(100)).jitter(0.0)),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    let m = Message::new("slow");
    let id = m.id().to_string();
    conn.publisher().unwrap().publish("", &q, m).unwrap();
    assert!(eventually(WAIT, || starts.lock().unwrap().len() == 2));
    let starts_seen = starts.lock().unwrap().clone();
    let gap = starts_seen[1].1 - starts_seen[0].1;
    assert_eq!(starts_seen[1].0, 2, "the overrun was retried");
    assert!(
        gap >= Duration::from_millis(300) && gap < Duration::from_millis(1500),
        "retried within the deadline (200 ms) + the retry wait (100 ms) + a bit: {gap:?}"
    );
    assert_eq!(orphans.running(), 1, "the stuck thread runs on, counted");
    assert_eq!(orphans.total(), 1);
    assert_eq!(*overruns.0.lock().unwrap(), vec![(id, 1, 1)]);
    release_tx.send(()).unwrap();
    assert!(
        eventually(WAIT, || orphans.running() == 0),
        "the orphan counted itself out when it finished"
    );
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn orphans_are_bounded_a_new_message_is_not_started_past_the_bound() {
    let deadline = Deadline::new(
        Duration::from_millis(50),
        DeadlineOptions::default().max_orphans(1),
    )
    .unwrap();
    let orphans = deadline.orphans();
    let calls = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    let c = calls.clone();
    let limited = deadline.around(move |_: &Message| {
        c.fetch_add(1, Ordering::SeqCst);
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Ok(Outcome::Accept)
    });
    let first = limited.handle(&Message::new("1")).unwrap();
    assert!(
        matches!(&first, Outcome::Retry { reason, .. } if reason.contains("did not finish within 50ms")),
        "{first:?}"
    );
    assert_eq!(orphans.running(), 1);
    let began = Instant::now();
    let second = limited.handle(&Message::new("2")).unwrap();
    assert!(
        matches!(&second, Outcome::Retry { reason, .. } if reason.contains("not started")),
        "{second:?}"
    );
    assert!(
        began.elapsed() < Duration::from_millis(50),
        "refused at once"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the second never started");
    release_tx.send(()).unwrap();
    assert!(eventually(WAIT, || orphans.running() == 0));
    // Room again: the next message starts and, finishing in time, settles as it decided.
    release_tx.send(()).unwrap();
    assert_eq!(limited.handle(&Message::new("3")).unwrap(), Outcome::Accept);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Every `acemq` log line of this test binary.
fn captured() -> &'static Mutex<Vec<String>> {
    static LINES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(|| Mutex::new(Vec::new()))
}

struct Capture;
impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("acemq")
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            captured()
                .lock()
                .unwrap()
                .push(format!("{} {} {}", r.level(), r.target(), r.args()));
        }
    }
    fn flush(&self) {}
}

#[test]
fn logging_records_id_type_attempt_outcome_and_never_the_payload() {
    if log::set_logger(&Capture).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
    let (conn, _clean, q) = support::declared_consumed_queue("chain-log");
    let secret = format!("card-4111-1111-{}", unique("secret"));
    let ok = Message::new(format!("{{\"card\":\"{secret}\"}}")).with_type("payment.taken");
    let failing =
        Message::new(format!("{{\"card\":\"{secret}\",\"fail\":true}}")).with_type("payment.taken");
    let (ok_id, failing_id) = (ok.id().to_string(), failing.id().to_string());
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, ok).unwrap();
    publisher.publish("", &q, failing).unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let handler = chain(
        move |m: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            let v: serde_json::Value = m.payload()?;
            if v["fail"] == serde_json::json!(true) {
                return Err("the card was declined".into());
            }
            Ok(Outcome::Accept)
        },
        [with_logging()],
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(handler)
        .unwrap();
    let line_for = |id: &str| {
        captured()
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(id) && l.contains("took="))
            .cloned()
    };
    assert!(eventually(WAIT, || line_for(&ok_id).is_some()
        && line_for(&failing_id).is_some()));
    consumer.close().unwrap();
    let ok_line = line_for(&ok_id).unwrap();
    assert!(ok_line.contains("type=payment.taken"), "{ok_line}");
    assert!(ok_line.contains("attempt=1"), "{ok_line}");
    assert!(ok_line.contains("outcome=accept"), "{ok_line}");
    assert!(ok_line.starts_with("INFO"), "{ok_line}");
    let failing_line = line_for(&failing_id).unwrap();
    assert!(
        failing_line.contains("outcome=error: the card was declined"),
        "{failing_line}"
    );
    let lines = captured().lock().unwrap();
    assert!(
        lines.iter().all(|l| !l.contains(&secret)),
        "a payload reached the log"
    );
}

/// The whole chain, `[with_logging(), with_timeout(d), with_idempotency(store),
/// with_ordering(key)]`, with a recording layer on every level: the layers run outermost first,
/// the idempotency guard absorbs a duplicate before anything inside it runs, the deadline settles
/// an overrun as a retry on time, and logging (outermost) records what those two decided.
#[test]
fn the_whole_chain_runs_in_order_and_logging_records_what_the_guards_decided() {
    if log::set_logger(&Capture).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(1);
    let (l, c) = (log.clone(), calls.clone());
    let handler = chain(
        move |m: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            l.lock().unwrap().push("handler".to_string());
            if m.body == b"slow" {
                // Held well past the deadline (released at the end of the test).
                let _ = gate_rx.recv_timeout(Duration::from_secs(30));
            }
            Ok(Outcome::Accept)
        },
        [
            recording("1", log.clone()),
            with_logging(),
            recording("2", log.clone()),
            with_timeout(Duration::from_millis(300)).unwrap(),
            recording("3", log.clone()),
            with_idempotency(InMemoryIdempotencyStore::new(Duration::from_secs(60))),
            recording("4", log.clone()),
            with_ordering(by_header("k")),
            recording("5", log.clone()),
        ],
    );
    assert!(
        handler.ordering().is_some(),
        "the ordering reaches the consumer"
    );
    let taken = |log: &Arc<Mutex<Vec<String>>>| std::mem::take(&mut *log.lock().unwrap());
    let line_for = |id: &str| {
        captured()
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(id) && l.contains("took="))
            .cloned()
            .collect::<Vec<_>>()
    };

    let m = Message::new("fast").with_header("k", "a");
    assert_eq!(handler.handle(&m).unwrap(), Outcome::Accept);
    assert_eq!(
        taken(&log),
        ["1>", "2>", "3>", "4>", "5>", "handler", "<5", "<4", "<3", "<2", "<1"]
    );
    // The same message again: absorbed by the idempotency guard; nothing inside it runs.
    assert_eq!(handler.handle(&m).unwrap(), Outcome::Accept);
    assert_eq!(taken(&log), ["1>", "2>", "3>", "<3", "<2", "<1"]);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    let lines = line_for(m.id());
    assert_eq!(lines.len(), 2, "logging saw both: {lines:?}");
    assert!(
        lines.iter().all(|l| l.contains("outcome=accept")),
        "{lines:?}"
    );

    // An overrun: settled as a retry when the deadline passes, not when the handler ends;
    // logging, outside the deadline, records the retry.
    let slow = Message::new("slow").with_header("k", "b");
    let started = Instant::now();
    let outcome = handler.handle(&slow).unwrap();
    let took = started.elapsed();
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert!(
        took < Duration::from_secs(20),
        "settled at the deadline, not when the handler was released ({took:?})"
    );
    let lines = line_for(slow.id());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("outcome=retry"), "{}", lines[0]);
    let order = taken(&log);
    assert_eq!(order[..2], ["1>", "2>"], "{order:?}");
    assert!(order.contains(&"<1".to_string()), "{order:?}");
    let _ = gate_tx.send(());
}
