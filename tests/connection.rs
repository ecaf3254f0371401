//! Connection, topology and recovery against the real broker.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use acemq_amqp::{
    Binding, Connection, ConnectionOptions, Error, ExchangeKind, ExchangeSpec, Message,
    PublisherOptions, QueueSpec,
};
use support::{connect, connect_with, eventually, unique, Cleanup, StopOnDrop};

#[test]
fn unreachable_broker_is_a_clear_error_without_the_password() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let e = Connection::open(&format!("amqp://bob:s3cret-pw@127.0.0.1:{port}/")).unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn conflicting_declaration_names_queue_and_argument_and_connection_goes_on() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("conflict"));
    conn.declare_queue(&QueueSpec::new(&q).message_ttl(Duration::from_secs(1)))
        .unwrap();
    let e = conn
        .declare_queue(&QueueSpec::new(&q).message_ttl(Duration::from_secs(2)))
        .unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&q), "{text}");
    assert!(text.contains("x-message-ttl"), "{text}");
    // Same settings again is fine, and the connection keeps working.
    conn.declare_queue(&QueueSpec::new(&q).message_ttl(Duration::from_secs(1)))
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    assert!(conn.is_connected());
}

#[test]
fn passive_checks_report_missing_queue_and_exchange() {
    let conn = connect();
    let e = conn.queue_info(&unique("nope")).unwrap_err();
    assert!(matches!(e, Error::NotFound { kind: "queue", .. }), "{e:?}");
    let e = conn.check_exchange(&unique("nope-x")).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotFound {
                kind: "exchange",
                ..
            }
        ),
        "{e:?}"
    );
    conn.check_exchange("amq.direct").unwrap();
}

#[test]
fn declares_quorum_and_stream_queues_and_bindings() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let x = clean.exchange(&unique("topic-x"));
    let quorum = clean.queue(&unique("quorum"));
    let stream = clean.queue(&unique("stream"));
    conn.declare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Topic))
        .unwrap();
    conn.declare_queue(&QueueSpec::new(&quorum).quorum())
        .unwrap();
    conn.declare_queue(&QueueSpec::stream(&stream, Default::default()))
        .unwrap();
    conn.bind(
        &Binding::new()
            .queue(&quorum)
            .exchange(&x)
            .routing_key("orders.*"),
    )
    .unwrap();
    let p = conn.publisher().unwrap();
    p.publish(&x, "orders.placed", Message::new("a")).unwrap();
    assert!(p
        .publish(&x, "payments.made", Message::new("b"))
        .unwrap_err()
        .is_unroutable());
    assert!(eventually(Duration::from_secs(5), || conn
        .queue_info(&quorum)
        .map(|i| i.message_count == 1)
        .unwrap_or(false)));
    // A quorum queue cannot be exclusive: refused before the broker sees it.
    let e = conn
        .declare_queue(&QueueSpec::new(unique("bad")).quorum().exclusive(true))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
}

#[test]
fn recovers_from_a_cut_under_load_and_redeclares_topology() {
    let (proxy, conn) = support::through_proxy_with(
        ConnectionOptions::new()
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(500))
            .heartbeat(Duration::from_secs(5)),
    );
    let mut clean = Cleanup::new(&conn);
    // An exclusive queue dies with its connection: only re-declaration brings it back.
    let q = clean.queue(&unique("recover"));
    conn.declare_queue(&QueueSpec::new(&q).durable(false).exclusive(true))
        .unwrap();
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(conn.generation(), Some(1));

    let stop = AtomicBool::new(false);
    let confirmed = AtomicUsize::new(0);
    let failed_retriably = AtomicUsize::new(0);
    std::thread::scope(|s| {
        // A failed assertion below must end the publishing threads, or the scope waits for ever.
        let _stop = StopOnDrop(&stop);
        for t in 0..4 {
            let (publisher, q, stop) = (&publisher, &q, &stop);
            let (confirmed, failed_retriably) = (&confirmed, &failed_retriably);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let tickets: Vec<_> = (0..20)
                        .filter_map(|_| {
                            i += 1;
                            match publisher.publish_deferred(
                                "",
                                q,
                                Message::new(format!("{t}-{i}")),
                            ) {
                                Ok(ticket) => Some(ticket),
                                Err(e) => {
                                    assert!(e.is_retriable(), "{e:?}");
                                    failed_retriably.fetch_add(1, Ordering::SeqCst);
                                    None
                                }
                            }
                        })
                        .collect();
                    for ticket in tickets {
                        let started = Instant::now();
                        match ticket.wait() {
                            Ok(()) => {
                                confirmed.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => {
                                // Unroutable while the exclusive queue is being re-declared.
                                assert!(e.is_retriable() || e.is_unroutable(), "{e:?}");
                                assert!(!e.is_timeout(), "a pending publish hung: {e:?}");
                                failed_retriably.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        assert!(started.elapsed() < Duration::from_secs(15));
                    }
                }
            });
        }
        assert!(
            eventually(Duration::from_secs(10), || confirmed.load(Ordering::SeqCst)
                > 0),
            "publishing got going"
        );
        proxy.refuse(true);
        proxy.cut();
        assert!(
            eventually(Duration::from_secs(10), || !conn.is_connected()),
            "the cut was noticed"
        );
        proxy.refuse(false);
        conn.wait_connected(Duration::from_secs(10))
            .expect("the connection comes back by itself");
        let after_recovery = confirmed.load(Ordering::SeqCst);
        assert!(
            eventually(Duration::from_secs(10), || confirmed.load(Ordering::SeqCst)
                > after_recovery + 100),
            "publishing goes on after the recovery: {} confirmed since",
            confirmed.load(Ordering::SeqCst) - after_recovery
        );
        stop.store(true, Ordering::SeqCst);
    });
    assert!(conn.generation().unwrap() >= 2);
    assert!(
        failed_retriably.load(Ordering::SeqCst) > 0,
        "the cut hit publishes in flight"
    );
    // The exclusive queue was re-declared on the new connection and still routes.
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert!(proxy.connections() >= 2);
}

/// The client's side of the connection ends while the broker still holds it (the client's
/// host vanished; the broker notices only at its heartbeat timeout): the new connection's
/// re-declaration of the exclusive queue is refused (405 RESOURCE_LOCKED) until the broker lets
/// the old connection go and deletes the queue. The queue must come back all the same.
#[test]
fn an_exclusive_queue_still_held_by_the_lost_connection_is_declared_again_once_released() {
    let (proxy, conn) = support::through_proxy_with(
        ConnectionOptions::new()
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(500))
            .heartbeat(Duration::from_secs(1)),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("held-exclusive"));
    conn.declare_queue(&QueueSpec::new(&q).durable(false).exclusive(true))
        .unwrap();
    assert_eq!(conn.generation(), Some(1));
    proxy.close_client_side();
    assert!(
        eventually(Duration::from_secs(10), || conn.generation() == Some(2)),
        "the connection came back"
    );
    // The broker lets the old connection go (and with it the queue it declared).
    assert!(
        eventually(Duration::from_secs(30), || proxy.open_connections() == 1),
        "the broker still holds the old connection: {proxy:?}"
    );
    let publisher = conn.publisher().unwrap();
    let routed = eventually(Duration::from_secs(30), || {
        publisher.publish("", &q, Message::new("after")).is_ok()
    });
    assert!(
        routed,
        "the exclusive queue was not declared again: {:?}",
        publisher.publish("", &q, Message::new("after"))
    );
}

#[test]
fn recovers_from_a_forced_close_by_the_broker() {
    let name = unique("forced-close");
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .name(name.clone())
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(500)),
    );
    let (_clean, q) = support::queue_on(&conn, "forced-q", |spec| spec);
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();

    assert!(
        eventually(
            Duration::from_secs(10),
            || support::close_connections_named(&name) == 1
        ),
        "our connection shows in rabbitmqctl under its name"
    );
    assert!(eventually(Duration::from_secs(10), || conn.generation() == Some(2)));
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 2);
}

#[test]
fn close_is_final_and_reported() {
    let conn = connect();
    let other = conn.clone();
    conn.close().unwrap();
    assert!(!other.is_connected());
    let e = other
        .declare_queue(&QueueSpec::new(unique("late")))
        .unwrap_err();
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    conn.close().unwrap(); // twice is harmless
}

#[test]
fn recovers_from_a_silent_peer_through_missed_heartbeats() {
    let (proxy, conn) = support::through_proxy_with(
        ConnectionOptions::new()
            .heartbeat(Duration::from_secs(1))
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(300)),
    );
    let (_clean, q) = support::queue_on(&conn, "heartbeat", |spec| spec);
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    let stalled_at = Instant::now();
    proxy.stall();
    assert!(
        eventually(Duration::from_secs(15), || conn.generation() == Some(2)),
        "the silent peer was noticed and the connection came back"
    );
    let noticed = stalled_at.elapsed();
    assert!(
        noticed >= Duration::from_secs(1),
        "noticed through heartbeats, after {noticed:?}"
    );
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 2);
}

/// `close()` while the supervisor is in the middle of a reconnect attempt that then fails: the
/// connection stays closed (not "recovering" for ever), so a consumer on it ends and
/// `RunningConsumer::wait()` returns instead of hanging.
#[test]
fn close_during_an_outage_is_final_and_a_consumer_on_it_ends() {
    let (_direct, _clean, q) = support::declared_queue("close-outage");
    let (proxy, conn) = support::through_proxy_with(
        ConnectionOptions::new()
            .connect_timeout(Duration::from_secs(3))
            .operation_timeout(Duration::from_secs(2))
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(100)),
    );
    let consumer = conn
        .consumer(&q, acemq_amqp::ConsumerOptions::new())
        .unwrap()
        .start(|_: &Message| Ok(acemq_amqp::Outcome::Accept))
        .unwrap();
    proxy.hang(true);
    proxy.cut();
    assert!(
        eventually(Duration::from_secs(20), || proxy.hung() >= 1),
        "a reconnect attempt is under way"
    );
    // Closed while that attempt waits for its timeout; it fails after the close.
    let _ = conn.close();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(consumer.wait());
    });
    let ended = rx.recv_timeout(Duration::from_secs(30));
    assert!(ended.is_ok(), "the consumer never ended after close()");
    let after = conn.queue_info(&q);
    assert!(
        matches!(after, Err(Error::Closed { .. })),
        "the connection stays closed: {after:?}"
    );
}
