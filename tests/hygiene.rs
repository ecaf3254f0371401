//! Hygiene (issue 17): opening and closing 500 consumers, publishers and relays (and 100
//! connections) leaves the process's thread count and open file descriptors where they
//! started (read from `/proc/self`); a password is never in `Debug` output or errors of any
//! type that holds a connection. Its own test binary, one test at a time, so no other test's
//! threads are counted.

mod support;

use std::sync::Mutex;
use std::time::Duration;

use acemq_amqp::patterns::acknowledged::{AmqpQueue, AmqpQueueOptions};
use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::patterns::outbox::{InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions};
use acemq_amqp::patterns::replay::{replay, ReplayOptions};
use acemq_amqp::patterns::request_reply::{Responder, ResponderOptions};
use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
use acemq_amqp::patterns::streams::{declare_stream, Offset, StreamOptions, StreamReader};
use acemq_amqp::{
    Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec, StreamRetention,
};
use support::{connect, unique};

static SERIAL: Mutex<()> = Mutex::new(());

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("read /proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a thread count")
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Waits (bounded) for the counts to come back to `baseline`; returns what they are.
fn back_to(baseline: (usize, usize)) -> (usize, usize) {
    let mut now = (threads(), fds());
    support::eventually(Duration::from_secs(15), || {
        now = (threads(), fds());
        now.0 <= baseline.0 && now.1 <= baseline.1
    });
    now
}

fn accept(_: &Message) -> acemq_amqp::HandlerResult {
    Ok(Outcome::Accept)
}

#[test]
fn five_hundred_consumers_publishers_and_relays_leave_no_thread_or_descriptor_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (conn, _clean, q) = support::declared_consumed_queue("hygiene");

    // Warm up every kind once (lazy statics, the connection's channels), then measure.
    let run_one_of_each = |i: usize| {
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().concurrency(2).declare(i == 0))
            .unwrap()
            .start(accept)
            .unwrap();
        consumer.close().unwrap();
        let publisher = conn.publisher().unwrap();
        publisher.publish("", &q, Message::new("x")).unwrap();
        publisher.close().unwrap();
        let relay = OutboxRelay::new(&conn, InMemoryOutboxStore::new(), OutboxRelayOptions::new())
            .unwrap()
            .start()
            .unwrap();
        relay.sweep().unwrap();
        relay.close().unwrap();
    };
    run_one_of_each(0);
    let baseline = (threads(), fds());
    for i in 1..=500 {
        run_one_of_each(i);
    }
    for _ in 0..100 {
        let c = connect();
        c.close().unwrap();
    }
    let after = back_to(baseline);
    println!(
        "hygiene: 500 consumers, publishers and relays and 100 connections opened and closed; \
         threads {} → {}, file descriptors {} → {}",
        baseline.0, after.0, baseline.1, after.1
    );
    assert!(
        after.0 <= baseline.0,
        "threads left behind: {} before, {} after",
        baseline.0,
        after.0
    );
    assert!(
        after.1 <= baseline.1,
        "file descriptors left behind: {} before, {} after",
        baseline.1,
        after.1
    );
}

#[test]
fn no_password_in_the_debug_output_or_errors_of_anything_holding_a_connection() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let user = support::users::BrokerUser::new("hyg-user", [".*", ".*", ".*"]);
    let url = user.url();
    let options = ConnectionOptions::new().address(&url).name("hygiene-debug");
    let mut seen = vec![format!("{options:?}")];
    let conn = support::connect_with(options);
    let (mut clean, q) = support::consumed_queue_on(&conn, "hyg-debug", |spec| spec);
    seen.push(format!("{conn:?}"));

    let publisher = conn.publisher().unwrap();
    seen.push(format!("{publisher:?}"));
    let consumer = conn.consumer(&q, ConsumerOptions::new()).unwrap();
    seen.push(format!("{consumer:?}"));
    let running = consumer.start(accept).unwrap();
    seen.push(format!("{running:?}"));
    let group = ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(2))
        .and_then(|group| group.start(accept))
        .unwrap();
    seen.push(format!("{group:?}"));
    let relay =
        OutboxRelay::new(&conn, InMemoryOutboxStore::new(), OutboxRelayOptions::new()).unwrap();
    seen.push(format!("{relay:?}"));
    let relay = relay.start().unwrap();
    seen.push(format!("{relay:?}"));
    let requester = support::requester(&conn, &q);
    seen.push(format!("{requester:?}"));
    let rq = clean.consumed_queue(&unique("hyg-serve"), &[]);
    conn.declare_queue(&QueueSpec::new(&rq)).unwrap();
    let responder = Responder::new(&conn, &rq, ResponderOptions::new())
        .and_then(|responder| {
            responder.start(|m: &Message| -> Result<Message, std::io::Error> {
                Ok(Message::new(m.body.clone()))
            })
        })
        .unwrap();
    seen.push(format!("{responder:?}"));
    seen.push(format!("{:?}", replay(&conn, &q, ReplayOptions::default())));
    let scheduler = Scheduler::new(&conn, SchedulerOptions::default())
        .and_then(Scheduler::start)
        .unwrap();
    seen.push(format!("{scheduler:?}"));
    let stream = clean.queue(&unique("hyg-stream"));
    declare_stream(&conn, &stream, StreamRetention::unbounded()).unwrap();
    let reader = StreamReader::new(&conn, &stream, StreamOptions::new().offset(Offset::First))
        .and_then(|reader| reader.start(accept))
        .unwrap();
    seen.push(format!("{reader:?}"));
    let aq = clean.queue(&unique("hyg-ack"));
    conn.declare_queue(&QueueSpec::new(&aq)).unwrap();
    let amqp_queue = AmqpQueue::open(&conn, &aq, AmqpQueueOptions::new().prefetch(10)).unwrap();
    seen.push(format!("{amqp_queue:?}"));
    // The `testing` feature's types that keep a URL with its credentials.
    let proxy = acemq_amqp::testing::FaultProxy::start(&url).unwrap();
    seen.push(format!("{proxy:?}"));
    let mut user_cleanup = acemq_amqp::testing::Cleanup::new(url.clone());
    user_cleanup.queue(&unique("hyg-cleanup"));
    seen.push(format!("{user_cleanup:?}"));

    // Errors: a refused connection, a missing queue, a conflicting declaration, a publish to
    // a missing exchange, a connection closed under a call.
    let refused = Connection::open(&format!(
        "amqp://{}:{}@127.0.0.1:1/",
        user.name, user.password
    ))
    .unwrap_err();
    seen.push(format!("{refused} {refused:?}"));
    let missing = conn.queue_info(&unique("hyg-missing")).unwrap_err();
    seen.push(format!("{missing} {missing:?}"));
    let conflict = conn
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap_err();
    seen.push(format!("{conflict} {conflict:?}"));
    let unroutable = publisher
        .publish(&unique("hyg-no-exchange"), "k", Message::new("x"))
        .unwrap_err();
    seen.push(format!("{unroutable} {unroutable:?}"));

    amqp_queue.close().unwrap();
    reader.close().unwrap();
    scheduler.close().unwrap();
    responder.close().unwrap();
    drop(requester);
    relay.close().unwrap();
    group.close().unwrap();
    running.close().unwrap();
    publisher.close().unwrap();
    conn.close().unwrap();
    let closed = conn.publisher().err();
    seen.push(format!("{closed:?}"));

    for text in &seen {
        assert!(!text.contains(&user.password), "the password is in: {text}");
    }
    assert!(
        seen.iter().any(|t| t.contains(&user.name)),
        "the user name is shown (so the URL was printed, without its password)"
    );
}
