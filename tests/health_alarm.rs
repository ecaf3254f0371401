//! A broker memory alarm leaves the health `up`, saying so in its detail, as the family reports a
//! blocked connection (issue 47): the link is up, the broker blocks publishing; the round trip is
//! not made while blocked (the broker reads nothing from a blocked connection). Its own test binary with this one test, as `tests/memory_alarm.rs`
//! explains: cargo runs test binaries one at a time, so the alarm cannot stall other tests,
//! and two alarms in one binary would overlap. The watermark is restored on every exit path
//! (`support::alarm::Watermark`).

mod support;

use std::time::Duration;

use acemq_amqp::health::HealthStatus;
use acemq_amqp::{ConnectionOptions, Message, PublisherOptions, QueueSpec};
use support::alarm::Watermark;
use support::{amqp_url, connect_with, eventually, unique, Cleanup};

/// Every publish outcome the connection's observer hears.
#[derive(Default)]
struct Outcomes(std::sync::Mutex<Vec<acemq_amqp::observe::PublishOutcome>>);

impl acemq_amqp::observe::Observer for Outcomes {
    fn publish_answered(&self, e: &acemq_amqp::observe::PublishEvent<'_>) {
        self.0.lock().unwrap().push(e.outcome);
    }
}

#[test]
fn under_a_memory_alarm_the_link_is_up_saying_it_is_blocked_and_plain_up_after_it() {
    let outcomes = std::sync::Arc::new(Outcomes::default());
    // Room for one unconfirmed 1 MiB body: under the alarm the next publish finds no room.
    let conn = connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .max_unconfirmed_bytes(2 << 20)
            .observer(outcomes.clone()),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("health-alarm"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(conn.health().status, HealthStatus::Up);

    let alarm = Watermark::alarm();
    // The broker blocks a connection only once it publishes.
    let body = vec![b'x'; 1 << 20];
    let mut tickets = Vec::new();
    let blocked = eventually(Duration::from_secs(20), || {
        if let Ok(t) = publisher.publish_deferred("", &q, Message::new(body.clone())) {
            tickets.push(t);
        }
        conn.is_blocked()
    });
    assert!(blocked, "the broker blocked the publishing connection");

    // A publish that cannot even be written while the broker blocks the connection is refused,
    // as the family counts it (`refused`, not `failed`), and says why.
    let mut refused = None;
    for _ in 0..20 {
        match publisher.publish_deferred("", &q, Message::new(body.clone())) {
            Ok(t) => tickets.push(t),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("a publish found no room under the alarm");
    assert!(
        matches!(&refused, acemq_amqp::Error::Blocked { .. }),
        "{refused:?}"
    );
    assert!(
        outcomes
            .0
            .lock()
            .unwrap()
            .contains(&acemq_amqp::observe::PublishOutcome::Refused),
        "the observer heard it refused: {:?}",
        outcomes.0.lock().unwrap()
    );

    let asked = std::time::Instant::now();
    let health = conn.health();
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "answered without a round trip: {:?}",
        asked.elapsed()
    );
    let broker = health.component("broker").unwrap();
    assert_eq!(broker.status, HealthStatus::Up, "{broker:?}");
    assert_eq!(broker.parts["blocked"], true);
    assert_eq!(broker.parts["connected"], true);
    let reason = broker.parts["blockedReason"]
        .as_str()
        .expect("the reason")
        .to_string();
    assert_eq!(
        broker.detail,
        format!("the broker has blocked this connection; publishing is paused: {reason}")
    );
    assert!(broker.parts.get("roundTripMillis").is_none(), "{broker:?}");
    assert_eq!(health.status, HealthStatus::Up);
    assert!(health.is_healthy());
    let json = health.to_value();
    assert_eq!(json["status"], "up");
    // The aggregate names the part with something to say, as Go's does.
    assert!(
        json["detail"].as_str().unwrap_or("").contains("broker"),
        "{json}"
    );

    drop(alarm);
    assert!(eventually(Duration::from_secs(30), || {
        let broker = conn.health().component("broker").cloned().unwrap();
        broker.status == HealthStatus::Up && broker.detail.is_empty()
    }));
    for t in tickets {
        t.wait_timeout(Duration::from_secs(30))
            .expect("confirmed after the alarm");
    }
    publisher.close().unwrap();
}
