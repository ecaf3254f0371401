//! A broker memory alarm makes the health `degraded`, not `down`: the link is up, the broker
//! blocks publishing. Its own test binary with this one test, as `tests/memory_alarm.rs`
//! explains: cargo runs test binaries one at a time, so the alarm cannot stall other tests,
//! and two alarms in one binary would overlap. The watermark is restored on every exit path
//! (`support::alarm::Watermark`).

mod support;

use std::time::Duration;

use acemq_amqp::health::HealthStatus;
use acemq_amqp::{ConnectionOptions, Message, PublisherOptions, QueueSpec};
use support::alarm::Watermark;
use support::{amqp_url, connect_with, eventually, unique, Cleanup};

#[test]
fn under_a_memory_alarm_the_link_is_degraded_and_up_again_after_it() {
    let conn = connect_with(ConnectionOptions::new().address(amqp_url()));
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

    let health = conn.health();
    let broker = health.component("broker").unwrap();
    assert_eq!(broker.status, HealthStatus::Degraded, "{broker:?}");
    assert_eq!(broker.parts["blocked"], true);
    assert_eq!(broker.parts["connected"], true);
    assert!(broker.detail.contains("blocked"), "{}", broker.detail);
    assert!(broker.parts["blocked_reason"].is_string());
    assert_eq!(health.status, HealthStatus::Degraded);
    assert!(health.is_healthy(), "degraded is not down: a probe passes");
    assert_eq!(health.to_value()["status"], "degraded");

    drop(alarm);
    assert!(eventually(Duration::from_secs(30), || conn.health().status
        == HealthStatus::Up));
    for t in tickets {
        t.wait_timeout(Duration::from_secs(30))
            .expect("confirmed after the alarm");
    }
    publisher.close().unwrap();
}
