//! `Connection::health()` against the real broker: the link, a running consumer (subscribed,
//! in flight, the age of its last settlement), a relay (its backlog, past a threshold
//! degraded), the application's checks under their deadlines, and a consumer that stopped
//! dropping out.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::health::{HealthCheckOptions, HealthReport, HealthStatus};
use acemq_amqp::patterns::outbox::{
    record_message, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions,
};
use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec};
use support::{connect, eventually, unique, Cleanup};

#[test]
fn a_running_consumer_shows_subscribed_in_flight_and_its_last_settlement_then_drops_out() {
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("health-consumer", QueueSpec::classic);

    let health = conn.health();
    assert_eq!(health.status, HealthStatus::Up, "{health}");
    let broker = health.component("broker").expect("the broker link");
    assert_eq!(broker.parts["connected"], true);
    assert_eq!(broker.parts["blocked"], false);

    // A handler that holds its message until released: one in flight.
    let (release, released) = crossbeam_channel::bounded::<()>(1);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().prefetch(4))
        .unwrap()
        .start(move |_: &Message| {
            if h.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = released.recv_timeout(Duration::from_secs(20));
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    let name = format!("consumer:{q}");
    let report = conn.health().component(&name).cloned().expect("listed");
    assert_eq!(report.status, HealthStatus::Up, "{report:?}");
    assert_eq!(report.parts["subscribed"], true);
    assert_eq!(report.parts["queue"], q.as_str());
    assert!(report.parts["lastSettlementAgeMillis"].is_null());

    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("held")).unwrap();
    assert!(eventually(Duration::from_secs(10), || {
        conn.health().component(&name).unwrap().parts["inFlight"] == 1
    }));
    release.send(()).unwrap();
    publisher.publish("", &q, Message::new("second")).unwrap();
    assert!(eventually(Duration::from_secs(10), || {
        let r = conn.health().component(&name).cloned().unwrap();
        r.parts["inFlight"] == 0 && r.parts["lastSettlementAgeMillis"].is_u64()
    }));
    let age = conn.health().component(&name).unwrap().parts["lastSettlementAgeMillis"]
        .as_u64()
        .unwrap();
    assert!(age < 10_000, "settled moments ago: {age} ms");

    // The JSON: the family's field names.
    let json = conn.health().to_value();
    assert_eq!(json["status"], "up");
    assert!(json["checked"].is_string());
    assert_eq!(json["parts"][&name]["parts"]["subscribed"], true);
    assert_eq!(json["parts"]["broker"]["status"], "up");

    consumer.close().unwrap();
    assert!(
        conn.health().component(&name).is_none(),
        "a closed consumer no longer appears"
    );
    publisher.close().unwrap();
}

#[test]
fn a_relay_shows_its_backlog_and_past_its_threshold_is_degraded() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    // Two records the relay cannot publish: no queue is bound to their routing key (mandatory:
    // unroutable), so they stay pending.
    let nowhere = clean.queue(&unique("health-relay-nowhere"));
    let store = InMemoryOutboxStore::new();
    for body in ["one", "two"] {
        store
            .add(&record_message("", &nowhere, &Message::new(body)).unwrap())
            .unwrap();
    }
    let relay = OutboxRelay::new(
        &conn,
        store,
        OutboxRelayOptions::new()
            .interval(Duration::from_millis(50))
            .health_backlog_threshold(1),
    )
    .unwrap()
    .start()
    .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || {
            conn.health()
                .component("outbox-relay")
                .is_some_and(|r| r.parts.get("backlog") == Some(&2.into()))
        }),
        "{}",
        conn.health().to_json()
    );
    let health = conn.health();
    let report = health.component("outbox-relay").unwrap();
    assert_eq!(report.status, HealthStatus::Degraded, "{report:?}");
    assert!(
        report.detail.contains("2 records wait"),
        "{}",
        report.detail
    );
    assert_eq!(report.parts["backlogThreshold"], 1);
    assert_eq!(health.status, HealthStatus::Degraded);
    assert!(health.is_healthy(), "degraded is not down");
    assert_eq!(health.detail, format!("outbox-relay: {}", report.detail));
    relay.close().unwrap();
    assert!(conn.health().component("outbox-relay").is_none());

    // An empty outbox: a relay up, its backlog 0.
    let relay = OutboxRelay::new(&conn, InMemoryOutboxStore::new(), OutboxRelayOptions::new())
        .unwrap()
        .start()
        .unwrap();
    assert!(eventually(Duration::from_secs(15), || {
        conn.health()
            .component("outbox-relay")
            .is_some_and(|r| r.parts.get("backlog") == Some(&0.into()))
    }));
    assert_eq!(
        conn.health().component("outbox-relay").unwrap().status,
        HealthStatus::Up
    );
    relay.close().unwrap();
}

#[test]
fn a_hanging_check_is_down_at_its_deadline_and_is_not_started_again_while_it_hangs() {
    let conn = connect();
    let started = Arc::new(AtomicUsize::new(0));
    let (_hold, held) = crossbeam_channel::bounded::<()>(0);
    let s = started.clone();
    conn.add_health_check(
        "stuck-dependency",
        HealthCheckOptions::new().deadline(Duration::from_millis(300)),
        move || {
            s.fetch_add(1, Ordering::SeqCst);
            let _ = held.recv_timeout(Duration::from_secs(30)); // hangs
            HealthReport::up()
        },
    )
    .unwrap();
    conn.add_health_check(
        "database",
        HealthCheckOptions::new().deadline(Duration::from_secs(2)),
        || HealthReport::up().part("pool", 4),
    )
    .unwrap();
    assert!(conn
        .add_health_check(
            "database",
            HealthCheckOptions::new().deadline(Duration::from_secs(1)),
            HealthReport::up
        )
        .is_err());
    assert!(conn
        .add_health_check(
            "zero",
            HealthCheckOptions::new().deadline(Duration::ZERO),
            HealthReport::up
        )
        .is_err());

    let asked = Instant::now();
    let health = conn.health();
    let took = asked.elapsed();
    // The hanging check would take 30 s; the answer comes at its 300 ms deadline (a
    // generous margin for a busy two-core box).
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(health.status, HealthStatus::Down);
    let stuck = health.component("stuck-dependency").unwrap();
    assert_eq!(stuck.status, HealthStatus::Down);
    assert!(
        stuck.detail.contains("did not answer within"),
        "{}",
        stuck.detail
    );
    assert_eq!(stuck.parts["timedOut"], true);
    assert_eq!(
        health.component("database").unwrap().status,
        HealthStatus::Up
    );
    assert!(
        health.detail.contains("stuck-dependency"),
        "{}",
        health.detail
    );

    // Asked again while it still hangs: not started a second time.
    let again = conn.health();
    assert_eq!(
        again.component("stuck-dependency").unwrap().status,
        HealthStatus::Down
    );
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert!(conn.remove_health_check("stuck-dependency"));
    assert_eq!(conn.health().status, HealthStatus::Up);
}

#[test]
fn a_check_that_panics_is_down_saying_so() {
    let conn = connect();
    conn.add_health_check(
        "panicky",
        HealthCheckOptions::new().deadline(Duration::from_secs(2)),
        || panic!("the cache is gone"),
    )
    .unwrap();
    let health = conn.health();
    let r = health.component("panicky").unwrap();
    assert_eq!(r.status, HealthStatus::Down);
    assert!(r.detail.contains("the cache is gone"), "{}", r.detail);
}

#[test]
fn each_member_of_a_consumer_group_appears_as_a_consumer_until_the_group_closes() {
    use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("health-group", QueueSpec::classic);
    let group = ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(2))
        .unwrap()
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap();
    let health = conn.health();
    for k in 1..=2 {
        let name = format!("consumer:{q}#{k}");
        let member = health
            .component(&name)
            .unwrap_or_else(|| panic!("{name} in {health:?}"));
        assert_eq!(member.parts["subscribed"], true);
    }
    group.close().unwrap();
    let health = conn.health();
    assert!(
        !health.components.iter().any(|(n, _)| n.contains(&q)),
        "{}",
        health.to_json()
    );
}

#[test]
fn a_consumer_stopped_through_its_handle_is_degraded_until_it_is_closed() {
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("health-stopped", QueueSpec::classic);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap();
    let name = format!("consumer:{q}");
    consumer.stop_handle().stop();
    assert!(eventually(Duration::from_secs(10), || {
        consumer.is_finished()
            && conn
                .health()
                .component(&name)
                .is_some_and(|r| r.detail.contains("has stopped"))
    }));
    let health = conn.health();
    let report = health.component(&name).expect("listed until closed");
    assert_eq!(report.status, HealthStatus::Degraded, "{report:?}");
    assert_eq!(report.parts["subscribed"], false);
    assert!(report.detail.contains("stopped"), "{}", report.detail);
    assert_eq!(health.status, HealthStatus::Degraded);
    let _ = consumer.wait();
    assert!(conn.health().component(&name).is_none());
}

#[test]
fn two_probes_at_once_share_a_slow_check_within_its_deadline_and_both_see_it_up() {
    let conn = connect();
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    // A slow dependency (1 s), well inside its 10 s deadline: the sleep is the dependency's
    // own work, not a wait for another thread.
    conn.add_health_check(
        "slow-dependency",
        HealthCheckOptions::new().deadline(Duration::from_secs(10)),
        move || {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(1));
            HealthReport::up()
        },
    )
    .unwrap();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| conn.health());
        assert!(eventually(Duration::from_secs(10), || started
            .load(Ordering::SeqCst)
            == 1));
        // A second probe (another actuator thread, a load balancer) while the run is under way.
        let second = conn.health();
        let first = first.join().unwrap();
        for (which, health) in [("first", &first), ("second", &second)] {
            let r = health.component("slow-dependency").unwrap();
            assert_eq!(r.status, HealthStatus::Up, "the {which} probe: {r:?}");
        }
    });
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "one run served both probes"
    );
}
