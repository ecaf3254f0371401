//! Interceptors on the real broker: the order they run in (first registered outermost), adding
//! headers, short-circuiting a publish and a handler, hearing how a delivery was really
//! settled, copies not intercepted, and the observer still told.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::intercept::{ConsumeContext, ConsumeNext, PublishContext, PublishNext, Settled};
use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Settlement;
use acemq_amqp::{
    dead_letter_queue, BoxError, Connection, ConnectionOptions, ConsumerOptions, Error,
    HandlerResult, Message, Outcome, QueueSpec, RetryPolicy, Ticket,
};
use support::{amqp_url, eventually, unique};

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, s: impl Into<String>) {
    log.lock().unwrap().push(s.into());
}

#[derive(Clone, Default)]
struct Settlements(Log);

impl Observer for Settlements {
    fn settled(&self, s: &Settlement<'_>) {
        push(&self.0, format!("observer: {}", s.outcome));
    }
}

fn publish_layer(
    log: &Log,
    name: &'static str,
) -> impl Fn(PublishContext, PublishNext<'_>) -> acemq_amqp::Result<Ticket> + Send + Sync + 'static
{
    let log = log.clone();
    move |mut c: PublishContext, next: PublishNext<'_>| {
        push(&log, format!("{name} publish in"));
        // Each adds its own header, and sees what an outer one added.
        let seen_outer = c.message.headers.contains_key("x-outer");
        c.message = c
            .message
            .with_header(format!("x-{name}"), format!("seen outer: {seen_outer}"));
        if name == "outer" && c.message.headers.contains_key("refuse") {
            push(&log, "outer refused");
            return Err(Error::InvalidArgument {
                reason: "refused by the outer interceptor".into(),
            });
        }
        let r = next.run(c);
        push(&log, format!("{name} publish out: {}", r.is_ok()));
        r
    }
}

fn consume_layer(
    log: &Log,
    name: &'static str,
) -> impl Fn(&mut ConsumeContext<'_>, &Message, ConsumeNext<'_>) -> HandlerResult + Send + Sync + 'static
{
    let log = log.clone();
    move |c: &mut ConsumeContext<'_>, m: &Message, next: ConsumeNext<'_>| {
        push(&log, format!("{name} consume in"));
        if name == "outer" && m.body == b"short" {
            push(&log, "outer answered itself");
            return Ok(Outcome::Accept);
        }
        let l = log.clone();
        c.when_settled(move |s: &Settled| push(&l, format!("{name} settled: {}", s.outcome)));
        let r = if name == "inner" {
            // Hands the handler a changed message.
            next.run(c, &m.clone().with_header("x-added-by-inner", "yes"))
        } else {
            next.run(c, m)
        };
        let answer = match &r {
            Ok(o) => o.label().to_string(),
            Err(e) => format!("error {e}"),
        };
        push(&log, format!("{name} consume out: {answer}"));
        r
    }
}

fn open(log: &Log, observer: Settlements) -> Connection {
    acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .observer(observer)
            .intercept_publish(publish_layer(log, "outer"))
            .intercept_publish(publish_layer(log, "inner"))
            .intercept_consume(consume_layer(log, "outer"))
            .intercept_consume(consume_layer(log, "inner")),
    )
    .unwrap_or_else(|e| panic!("RabbitMQ is not reachable ({e}): run `scripts/test`"))
}

#[test]
fn interceptors_run_first_registered_outermost_around_the_publish_and_the_handler() {
    let log: Log = Log::default();
    let conn = open(&log, Settlements(log.clone()));
    let (_clean, q) = support::consumed_queue_on(&conn, "intercept", QueueSpec::classic);
    let handled = Arc::new(Mutex::new(Vec::new()));
    let h = handled.clone();
    let l = log.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| -> Result<Outcome, BoxError> {
            push(&l, "handler");
            h.lock().unwrap().push(m.clone());
            // Asks for a retry it does not have: the consumer dead-letters it.
            Ok(Outcome::retry("once more"))
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("hello")).unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(eventually(Duration::from_secs(30), || conn
        .queue_info(&dlq)
        .unwrap()
        .message_count
        == 1));
    assert!(
        eventually(Duration::from_secs(10), || log
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.starts_with("observer: "))),
        "{:?}",
        log.lock().unwrap()
    );
    consumer.close().unwrap();
    let got = handled.lock().unwrap()[0].clone();
    let text = |n: &str| {
        got.headers
            .get(n)
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    assert_eq!(text("x-outer").as_deref(), Some("seen outer: false"));
    assert_eq!(text("x-inner").as_deref(), Some("seen outer: true"));
    assert_eq!(text("x-added-by-inner").as_deref(), Some("yes"));
    let log = log.lock().unwrap().clone();
    // Two threads write the log: the publisher's (its interceptors hear the broker's answer
    // when the confirm comes) and the consumer's. The broker may deliver the message before
    // the publisher hears its confirm, so the two sequences are checked each in its own
    // order, and only what causality fixes across them: published before consumed.
    let publish: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|e| e.contains("publish"))
        .collect();
    assert_eq!(
        publish,
        [
            "outer publish in",
            "inner publish in",
            "inner publish out: true",
            "outer publish out: true",
        ],
        "{log:?}"
    );
    let consume: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|e| !e.contains("publish"))
        .collect();
    assert_eq!(
        consume,
        [
            "outer consume in",
            "inner consume in",
            "handler",
            "inner consume out: retry",
            "outer consume out: retry",
            // What really happened: no attempt left, dead-lettered. The dead-letter copy
            // is not a publish of the application's: no publish interceptor ran for it.
            "outer settled: reject",
            "inner settled: reject",
            // The observer hears the consumer's decision too, in its own word: no attempt
            // left is `dead_letter` (the handler's own reject would be `reject`).
            "observer: dead_letter",
        ],
        "{log:?}"
    );
    let at = |entry: &str| log.iter().position(|e| e == entry).unwrap();
    assert!(
        at("inner publish in") < at("outer consume in"),
        "published before consumed: {log:?}"
    );
}

#[test]
fn an_interceptor_short_circuits_a_publish_and_a_handler() {
    let log: Log = Log::default();
    let conn = open(&log, Settlements::default());
    let (_clean, q) = support::consumed_queue_on(&conn, "intercept-short", QueueSpec::classic);
    let publisher = conn.publisher().unwrap();
    let e = publisher
        .publish("", &q, Message::new("x").with_header("refuse", true))
        .unwrap_err();
    assert!(e.to_string().contains("refused by the outer"), "{e}");
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "nothing sent"
    );
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |_: &Message| {
            *c.lock().unwrap() += 1;
            Ok(Outcome::Accept)
        })
        .unwrap();
    publisher.publish("", &q, Message::new("short")).unwrap();
    assert!(eventually(Duration::from_secs(30), || log
        .lock()
        .unwrap()
        .iter()
        .any(|e| e == "outer answered itself")));
    assert!(eventually(Duration::from_secs(10), || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 0));
    consumer.close().unwrap();
    assert_eq!(*calls.lock().unwrap(), 0, "the handler never ran");
    assert!(!log.lock().unwrap().iter().any(|e| e == "inner consume in"));
}

/// A publish interceptor hears how each publish ended once the broker answered, as the
/// family's interceptors see `confirmed` and `routed`: confirmed for one that reached a queue,
/// unroutable for one that reached none — whether or not the caller waits on the ticket.
#[test]
fn a_publish_interceptor_hears_the_brokers_answer() {
    let answers: Log = Log::default();
    let a = answers.clone();
    let conn = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .intercept_publish(
                move |mut context: PublishContext,
                      next: PublishNext<'_>|
                      -> Result<Ticket, Error> {
                    let (a, key) = (a.clone(), context.routing_key.clone());
                    context.when_answered(move |answer| {
                        let word = match answer {
                            Ok(()) => "confirmed".to_string(),
                            Err(e) if e.is_unroutable() => "unroutable".to_string(),
                            Err(e) => format!("failed: {e}"),
                        };
                        push(&a, format!("{key}: {word}"));
                    });
                    next.run(context)
                },
            ),
    )
    .unwrap_or_else(|e| panic!("RabbitMQ is not reachable ({e}): run `scripts/test`"));
    let (_clean, q) = support::queue_on(&conn, "intercept-answer", QueueSpec::classic);
    let nowhere = unique("intercept-nowhere");
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("routed")).unwrap();
    assert!(publisher
        .publish("", &nowhere, Message::new("lost"))
        .unwrap_err()
        .is_unroutable());
    // A ticket nobody waits for is answered all the same.
    let ticket = publisher
        .publish_deferred("", &q, Message::new("not waited for"))
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || answers
        .lock()
        .unwrap()
        .len()
        == 3));
    drop(ticket);
    assert_eq!(
        *answers.lock().unwrap(),
        [
            format!("{q}: confirmed"),
            format!("{nowhere}: unroutable"),
            format!("{q}: confirmed"),
        ]
    );
    publisher.close().unwrap();
}
