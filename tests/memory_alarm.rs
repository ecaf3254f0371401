//! A broker memory alarm (`connection.blocked`): the broker stops reading from publishing
//! connections. Its own test binary — cargo runs test binaries one at a time, so the alarm
//! cannot stall other tests — and the watermark is restored on every exit path (the guard
//! `support::alarm::Watermark`, which runs on panic too and, from a watchdog, after 40 s at
//! most). One test only: two alarms in one binary would overlap.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::ConnectionEvent;
use acemq_amqp::observe::Observer;
use acemq_amqp::{ConnectionOptions, Message, PublisherOptions, QueueSpec};
use support::alarm::Watermark;
use support::{amqp_url, eventually, unique, Cleanup};

/// Records the blocked / unblocked notices.
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

impl Observer for Notices {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        match event {
            ConnectionEvent::Blocked { reason } => {
                self.0.lock().unwrap().push(format!("blocked: {reason}"))
            }
            ConnectionEvent::Unblocked => self.0.lock().unwrap().push("unblocked".into()),
            _ => {}
        }
    }
}

#[test]
fn under_a_memory_alarm_publishing_is_reported_blocked_and_recovers_after_it() {
    let notices = Notices::default();
    let conn = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .observer(notices.clone()),
    )
    .unwrap_or_else(|e| panic!("RabbitMQ is not reachable ({e}): run `scripts/test`"));
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("memory-alarm"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let timeout = Duration::from_secs(1);
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    assert!(!publisher.is_blocked() && !conn.is_blocked());
    // Without confirms (at most once): as bounded, and as refused, under the alarm.
    let unconfirmed_conn = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .max_unconfirmed_bytes(2 << 20),
    )
    .unwrap();
    let unconfirmed_timeout = Duration::from_millis(500);
    let unconfirmed = unconfirmed_conn
        .publisher_with(
            PublisherOptions::new()
                .confirms(false)
                .timeout(unconfirmed_timeout),
        )
        .unwrap();
    unconfirmed
        .publish("", &q, Message::new("unconfirmed before"))
        .unwrap();
    let alarm = Watermark::alarm();
    let body = vec![b'x'; 1 << 20];
    let mut tickets = Vec::new();
    let mut blocked = 0;
    // 20 MiB: more than amiquip buffers (16 MiB) before it would block a publishing thread.
    for i in 0..20 {
        let started = Instant::now();
        match publisher.publish_deferred("", &q, Message::new(body.clone())) {
            Ok(t) => tickets.push(t),
            Err(e) => {
                assert!(
                    matches!(&e, acemq_amqp::Error::Blocked { after, .. } if *after == timeout),
                    "{e}"
                );
                assert!(e.is_retriable() && e.is_timeout(), "{e}");
                assert!(e.to_string().contains("blocking publishing"), "{e}");
                blocked += 1;
            }
        }
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_secs(3),
            "publish {i} took {took:?}"
        );
    }
    assert!(blocked > 0, "the alarm held publishes back");
    assert!(!tickets.is_empty());
    assert!(publisher.is_blocked() && conn.is_blocked());
    let reason = conn.blocked_reason().expect("the broker's reason");
    assert!(
        notices
            .0
            .lock()
            .unwrap()
            .contains(&format!("blocked: {reason}")),
        "{:?}",
        notices.0.lock().unwrap()
    );
    let _ = format!("{publisher:?} {}", publisher.in_flight());
    // The unconfirmed publisher hands over what its connection's budget (2 MiB) holds, then
    // answers `Blocked` within its timeout: nothing piles up in amiquip's buffers.
    let (mut handed_over, mut refused) = (0, 0);
    for i in 0..6 {
        let started = Instant::now();
        match unconfirmed.publish("", &q, Message::new(body.clone())) {
            Ok(()) => handed_over += 1,
            Err(e) => {
                assert!(matches!(&e, acemq_amqp::Error::Blocked { .. }), "{e}");
                refused += 1;
            }
        }
        let took = started.elapsed();
        assert!(
            took < unconfirmed_timeout + Duration::from_secs(3),
            "unconfirmed publish {i} took {took:?}"
        );
    }
    assert!(
        (1..=2).contains(&handed_over) && refused > 0,
        "handed over {handed_over}, refused {refused}"
    );
    drop(alarm);
    // The alarm is over: reported, and what was handed over is confirmed.
    assert!(eventually(Duration::from_secs(30), || !conn.is_blocked()));
    assert!(notices.0.lock().unwrap().contains(&"unblocked".to_string()));
    for t in tickets {
        t.wait_timeout(Duration::from_secs(30))
            .expect("confirmed after the alarm");
    }
    publisher.publish("", &q, Message::new("after")).unwrap();
    // What the unconfirmed publisher handed over arrives once the broker reads again.
    unconfirmed.close().unwrap();
    assert_eq!(unconfirmed.in_flight(), 0);
    unconfirmed_conn.close().unwrap();
}
