//! The faults only the memory broker gives on demand (RabbitMQ cannot do these
//! deterministically): a connection cut, nacked publishes, a memory alarm, held deliveries.
//! Plain tests on `memory://` only (issue 38).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::testing::MemoryBroker;
use acemq_amqp::{
    Connection, ConnectionOptions, ConsumerOptions, Error, Message, Outcome, PublisherOptions,
    QueueSpec,
};
use support::{eventually, unique};

const WAIT: Duration = Duration::from_secs(20);

fn broker(test: &str) -> MemoryBroker {
    MemoryBroker::named(&unique(test))
}

fn connect(broker: &MemoryBroker) -> Connection {
    Connection::open_with(
        ConnectionOptions::new()
            .address(broker.url())
            .backoff_min(Duration::from_millis(20))
            .backoff_max(Duration::from_millis(100)),
    )
    .expect("connect to memory://")
}

/// A consumer that keeps the bodies it receives.
fn collect(conn: &Connection, q: &str) -> (acemq_amqp::RunningConsumer, Arc<Mutex<Vec<Vec<u8>>>>) {
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let g = got.clone();
    let consumer = conn
        .consumer(q, ConsumerOptions::new().declare(false))
        .unwrap()
        .start(move |m: &Message| {
            g.lock().unwrap().push(m.body.clone());
            Ok(Outcome::Accept)
        })
        .unwrap();
    (consumer, got)
}

#[test]
fn after_a_cut_the_supervisor_reconnects_and_redeclares_and_a_consumer_goes_on_receiving() {
    let broker = broker("mf-cut");
    let conn = connect(&broker);
    let q = unique("mf-cut-q");
    // Auto-delete + exclusive: gone with the connection, so only a re-declare brings it back.
    let temp = unique("mf-cut-temp");
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    conn.declare_queue(&QueueSpec::new(&temp).classic().exclusive(true))
        .unwrap();
    let (consumer, got) = collect(&conn, &q);
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 1));
    let generation = conn.generation();
    assert!(broker.cut_connections() >= 1);
    assert!(
        eventually(WAIT, || conn.is_connected()
            && conn.generation() != generation),
        "reconnected"
    );
    assert!(
        eventually(WAIT, || broker.queue_depth(&temp).is_some()),
        "the exclusive queue re-declared"
    );
    assert!(eventually(WAIT, || broker.consumer_count(&q) == Some(1)));
    assert!(eventually(WAIT, || publisher
        .publish("", &q, Message::new("after"))
        .is_ok()));
    assert!(
        eventually(WAIT, || got.lock().unwrap().iter().any(|b| b == b"after")),
        "the consumer goes on receiving: {:?}",
        got.lock().unwrap()
    );
    consumer.close().unwrap();
    publisher.close().unwrap();
}

#[test]
fn a_nacked_publish_is_reported_as_error_nacked_and_the_next_goes_through() {
    let broker = broker("mf-nack");
    let conn = connect(&broker);
    let q = unique("mf-nack-q");
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let publisher = conn.publisher().unwrap();
    broker.nack_next_publishes(1);
    let m = Message::new("refused");
    let id = m.id().to_string();
    match publisher.publish("", &q, m) {
        Err(e @ Error::Nacked { .. }) => {
            assert!(e.is_retriable(), "{e}");
            let Error::Nacked { message_id } = e else {
                unreachable!()
            };
            assert_eq!(message_id, id);
        }
        other => panic!("expected Error::Nacked, got {other:?}"),
    }
    assert_eq!(broker.queue_depth(&q), Some(0), "not enqueued");
    publisher.publish("", &q, Message::new("next")).unwrap();
    assert_eq!(broker.queue_depth(&q), Some(1));
    publisher.close().unwrap();
}

#[test]
fn under_an_alarm_a_publish_is_reported_blocked_and_goes_through_after_unblock() {
    let broker = broker("mf-block");
    let conn = connect(&broker);
    let q = unique("mf-block-q");
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let timeout = Duration::from_millis(500);
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    broker.block("low on memory");
    assert!(eventually(WAIT, || conn.is_blocked()));
    assert_eq!(conn.blocked_reason().as_deref(), Some("low on memory"));
    let ticket = publisher.publish_deferred("", &q, Message::new("held"));
    let e = match ticket {
        Ok(t) => t.wait().expect_err("not confirmed under the alarm"),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::Blocked { reason, after } if reason == "low on memory" && *after == timeout),
        "{e}"
    );
    assert!(e.is_retriable() && e.is_timeout(), "{e}");
    assert_eq!(broker.queue_depth(&q), Some(0), "held, not routed");
    broker.unblock();
    assert!(eventually(WAIT, || !conn.is_blocked()));
    assert!(
        eventually(WAIT, || broker.queue_depth(&q) == Some(1)),
        "the held publish went through after unblock"
    );
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert_eq!(broker.queue_depth(&q), Some(2));
    publisher.close().unwrap();
}

#[test]
fn held_deliveries_reach_nobody_until_released() {
    let broker = broker("mf-hold");
    let conn = connect(&broker);
    let q = unique("mf-hold-q");
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let (consumer, got) = collect(&conn, &q);
    assert!(eventually(WAIT, || broker.consumer_count(&q) == Some(1)));
    broker.hold_deliveries(&q);
    let publisher = conn.publisher().unwrap();
    for i in 0..3 {
        publisher
            .publish("", &q, Message::new(format!("{i}")))
            .unwrap();
    }
    assert_eq!(
        broker.queue_depth(&q),
        Some(3),
        "all ready, none dispatched"
    );
    assert_eq!(broker.unacked(&q), Some(0));
    assert!(got.lock().unwrap().is_empty());
    broker.release_deliveries(&q);
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 3));
    assert_eq!(
        *got.lock().unwrap(),
        vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec()]
    );
    consumer.close().unwrap();
    publisher.close().unwrap();
}
