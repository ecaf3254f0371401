//! The broker link's health asks the broker, as the family's Go and Python connection checks do
//! (issue 47): a round trip (a passive declare of `amq.direct` on a short-lived channel, which
//! needs no permission) under a deadline of 3 s, so an open but wedged connection is `down`
//! within that deadline instead of after two missed heartbeats; probes arriving faster than
//! once a second share one round trip; and the report's keys are the family's camelCase.

mod support;

use std::time::{Duration, Instant};

use acemq_amqp::health::{HealthCheckOptions, HealthReport, HealthStatus};
use acemq_amqp::patterns::outbox::{InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions};
use acemq_amqp::testing::FaultProxy;
use acemq_amqp::{ConnectionOptions, ConsumerOptions, Outcome, QueueSpec};
use support::{connect_with, eventually, unique};

#[test]
fn a_wedged_connection_is_down_within_the_round_trip_deadline_not_after_two_heartbeats() {
    let proxy = FaultProxy::start(&support::amqp_url()).expect("fault proxy");
    // The default heartbeat (10 s): missed heartbeats would take about 17 s to notice.
    let conn = connect_with(ConnectionOptions::new().address(proxy.url()));
    let broker = conn.health().component("broker").unwrap().clone();
    assert_eq!(broker.status, HealthStatus::Up, "{broker:?}");
    assert!(broker.parts["roundTripMillis"].is_u64(), "{broker:?}");

    proxy.stall();
    let stalled = Instant::now();
    let mut last = None;
    assert!(
        eventually(Duration::from_secs(15), || {
            let health = conn.health();
            let down = health.status == HealthStatus::Down;
            last = Some(health);
            down
        }),
        "a wedged connection reads down: {last:?}"
    );
    let took = stalled.elapsed();
    // The last round trip's answer is reused for up to 1 s, then the next one has 3 s.
    assert!(
        took < Duration::from_secs(8),
        "down after {took:?}, not within the round trip's deadline"
    );
    assert!(conn.is_connected(), "the heartbeats have not given up yet");
    let broker = last.unwrap().component("broker").unwrap().clone();
    assert!(
        broker
            .detail
            .starts_with("the broker did not answer within"),
        "{broker:?}"
    );
    assert!(broker.parts.get("roundTripMillis").is_none(), "{broker:?}");

    proxy.resume();
    assert!(
        eventually(Duration::from_secs(15), || conn.health().status
            == HealthStatus::Up),
        "up again once the broker answers"
    );
}

#[test]
fn probes_every_100_ms_from_four_threads_make_a_round_trip_at_most_once_a_second() {
    let (proxy, conn) =
        support::through_proxy_with(ConnectionOptions::new().heartbeat(Duration::from_secs(60)));
    // What one round trip sends, the probe queue declared for the first time.
    let before = proxy.bytes_upstream();
    assert_eq!(conn.health().status, HealthStatus::Up);
    let one = proxy.bytes_upstream() - before;
    assert!(one > 0, "the first probe asked the broker");

    let before = proxy.bytes_upstream();
    let started = Instant::now();
    let probes = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while started.elapsed() < Duration::from_secs(3) {
                    let health = conn.health();
                    assert_eq!(health.status, HealthStatus::Up, "{health:?}");
                    probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // The probes' cadence (a load balancer's), not a wait for anything.
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    let sent = proxy.bytes_upstream() - before;
    let probes = probes.into_inner();
    assert!(probes >= 40, "{probes} probes");
    // Three seconds allow at most four round trips (one per second, plus the one under way).
    assert!(
        sent <= 5 * one,
        "{probes} probes sent {sent} bytes upstream; one round trip is {one}"
    );
}

#[test]
fn the_reports_keys_are_the_familys_camel_case() {
    let url = support::amqp_url();
    let conn = connect_with(ConnectionOptions::new().address(url.clone()));
    let (_clean, q) = support::queue_on(&conn, "health-keys", |spec| spec);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(|_: &acemq_amqp::Message| Ok(Outcome::Accept))
        .unwrap();
    let relay = OutboxRelay::new(&conn, InMemoryOutboxStore::new(), OutboxRelayOptions::new())
        .unwrap()
        .start()
        .unwrap();
    conn.add_health_check(
        "too-slow",
        HealthCheckOptions::new().deadline(Duration::from_millis(50)),
        || {
            // The dependency's own slowness (past the check's 50 ms deadline), not a wait for
            // another thread.
            std::thread::sleep(Duration::from_millis(500));
            HealthReport::up()
        },
    )
    .unwrap();
    let health = conn.health();
    let broker = health.component("broker").unwrap();
    assert_eq!(broker.parts["consumers"], 1, "{broker:?}");
    assert!(broker.parts["roundTripMillis"].is_u64(), "{broker:?}");
    assert_eq!(broker.parts["blocked"], false);
    let value = health.to_value();
    let mut keys = Vec::new();
    for (name, part) in value["parts"].as_object().unwrap() {
        for key in part["parts"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            keys.push(format!("{name}.{key}"));
        }
    }
    assert!(
        keys.iter().any(|k| k.starts_with("outbox-relay."))
            && keys.iter().any(|k| k.starts_with("consumer:"))
            && keys.iter().any(|k| k.starts_with("too-slow.")),
        "{keys:?}"
    );
    let snake: Vec<_> = keys
        .iter()
        .filter(|k| k.rsplit('.').next().unwrap().contains('_'))
        .collect();
    assert!(snake.is_empty(), "keys not in camelCase: {snake:?}");
    relay.close().unwrap();
    consumer.close().unwrap();
}

/// A service whose broker user may configure, write and read nothing (a least-privilege
/// deployment, or one whose queues an operator declares) is still `up`: the round trip needs no
/// permission. A check that declared a queue of its own (as Go's does) would read `down` here.
#[test]
fn a_user_with_no_permission_at_all_still_reads_up() {
    let user = support::users::BrokerUser::new("health-powerless", ["^$", "^$", "^$"]);
    let conn = connect_with(ConnectionOptions::new().address(user.url()));
    let health = conn.health();
    let broker = health.component("broker").unwrap();
    assert_eq!(broker.status, HealthStatus::Up, "{broker:?}");
    assert!(broker.parts["roundTripMillis"].is_u64(), "{broker:?}");
    // And it really may not declare anything: the check proves nothing it could not do.
    let refused = conn.declare_queue(&QueueSpec::new(unique("health-powerless-q")).classic());
    assert!(refused.is_err(), "{refused:?}");
    conn.close().unwrap();
}
