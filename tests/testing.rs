//! The public `testing` module: the fault proxy's own behaviour (cut, stall and resume, refuse,
//! counts, drop), `Cleanup` after a panicking test (in a child process), and `received` with
//! the pattern wrappers.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::patterns::chain::{chain, with_idempotency, with_logging, with_ordering};
use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
use acemq_amqp::patterns::ordering::{by_header, ordered};
use acemq_amqp::testing::{received, wait_until, Cleanup, FaultProxy, TestNames};
use acemq_amqp::{
    Connection, ConnectionOptions, Error, ExchangeSpec, Handler, Message, Outcome, QueueSpec,
};
use support::{amqp_url, connect, connect_with};

const WAIT: Duration = Duration::from_secs(20);

fn proxy() -> FaultProxy {
    FaultProxy::start(&amqp_url()).expect("start the fault proxy")
}

/// A plain TCP echo server on a loopback port, for the proxy's byte-level behaviour.
fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn read_exactly(stream: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf)?;
    Ok(buf)
}

#[test]
fn the_proxy_url_keeps_the_upstream_credentials_and_vhost() {
    // The tests' broker (ACEMQ_TEST_AMQP_URL's host and port), with other credentials and vhost.
    let upstream = support::broker_addr();
    let p = FaultProxy::start(&format!("amqp://bob:secret@{upstream}/orders?heartbeat=5")).unwrap();
    assert_eq!(
        p.url(),
        format!("amqp://bob:secret@{}/orders?heartbeat=5", p.addr())
    );
    let plain = FaultProxy::start(&upstream).unwrap();
    assert_eq!(plain.url(), format!("amqp://guest:guest@{}/", plain.addr()));
    assert!(FaultProxy::start("amqp:///").is_err());
}

#[test]
fn a_cut_closes_every_connection_and_the_library_reconnects_through_the_proxy() {
    let proxy = proxy();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(300)),
    );
    let names = TestNames::current();
    let mut clean = Cleanup::new(amqp_url());
    let q = clean.queue(&names.queue("cut"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    assert_eq!(proxy.connections(), 1);
    assert_eq!(proxy.open_connections(), 1);
    let (up, down) = (proxy.bytes_upstream(), proxy.bytes_downstream());
    assert!(up > 0 && down > 0, "bytes counted both ways: {up} {down}");

    proxy.cut();
    wait_until(WAIT, || conn.generation() == Some(2)).expect("reconnected after the cut");
    assert_eq!(proxy.connections(), 2, "one new connection");
    assert_eq!(proxy.open_connections(), 1, "the cut one is gone");
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert!(proxy.bytes_upstream() > up);
    assert_eq!(connect().queue_info(&q).unwrap().message_count, 2);
}

#[test]
fn a_stall_holds_the_bytes_and_resume_delivers_them_in_order() {
    let proxy = FaultProxy::start(&echo_server()).unwrap();
    let mut client = TcpStream::connect(proxy.addr()).unwrap();
    client.write_all(b"one").unwrap();
    assert_eq!(read_exactly(&mut client, 3).unwrap(), b"one");

    proxy.stall();
    client.write_all(b"two").unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 3];
    let e = client.read(&mut buf).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "nothing gets through a stall: {e:?}"
    );
    // A connection made during the stall is not held.
    let mut other = TcpStream::connect(proxy.addr()).unwrap();
    other.write_all(b"new").unwrap();
    assert_eq!(read_exactly(&mut other, 3).unwrap(), b"new");

    proxy.resume();
    client.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(
        read_exactly(&mut client, 3).unwrap(),
        b"two",
        "held, not lost"
    );
    assert_eq!(proxy.connections(), 2);
}

#[test]
fn a_stall_past_two_heartbeats_makes_the_library_reconnect() {
    let proxy = proxy();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .heartbeat(Duration::from_secs(1))
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(300)),
    );
    let names = TestNames::current();
    let mut clean = Cleanup::new(amqp_url());
    let q = clean.queue(&names.queue("stall"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let stalled_at = Instant::now();
    proxy.stall();
    wait_until(WAIT, || conn.generation() == Some(2))
        .expect("the silent peer was noticed and the connection came back");
    let noticed = stalled_at.elapsed();
    assert!(
        noticed >= Duration::from_secs(1),
        "noticed through missed heartbeats, after {noticed:?}"
    );
    assert_eq!(proxy.connections(), 2);
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("after"))
        .unwrap();
    // The held connection, closed by the client meanwhile, ends once it may flow again.
    proxy.resume();
    wait_until(WAIT, || proxy.open_connections() == 1).expect("the stalled connection ended");
    assert!(conn.is_connected());
}

#[test]
fn refusing_makes_connect_fail_with_a_clear_error_until_allowed_again() {
    let proxy = proxy();
    let options = || {
        ConnectionOptions::new()
            .address(proxy.url())
            .connect_timeout(Duration::from_secs(5))
    };
    proxy.refuse(true);
    let started = Instant::now();
    let e = acemq_amqp::Connection::open_with(options()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "fails at once");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&proxy.addr().to_string()), "{text}");
    assert!(!text.contains("guest:guest"), "no password: {text}");
    assert_eq!(
        proxy.connections(),
        0,
        "a refused connection is not counted"
    );

    proxy.refuse(false);
    let conn = acemq_amqp::Connection::open_with(options()).expect("accepted again");
    assert!(conn.is_connected());
    assert_eq!(proxy.connections(), 1);
    conn.close().unwrap();
}

#[test]
fn dropping_the_proxy_closes_its_connections_and_frees_its_port() {
    let proxy = FaultProxy::start(&echo_server()).unwrap();
    let addr = proxy.addr();
    let mut client = TcpStream::connect(addr).unwrap();
    client.write_all(b"hi").unwrap();
    assert_eq!(read_exactly(&mut client, 2).unwrap(), b"hi");
    // Held connections are closed too.
    proxy.stall();

    drop(proxy);
    client.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 8];
    match client.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the connection is closed by the drop: {other:?}"),
    }
    let e = TcpStream::connect(addr).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e:?}");
    TcpListener::bind(addr).expect("the port is free again");
}

/// Run as a child process by `cleanup_deletes_what_a_panicking_test_declared`: declares a
/// queue, an exchange and a table, registers them, then panics.
#[test]
#[ignore = "a child process of cleanup_deletes_what_a_panicking_test_declared"]
fn cleanup_child_declares_then_panics() {
    let Ok(spec) = std::env::var("ACEMQ_CLEANUP_CHILD") else {
        return; // run by hand: nothing to do
    };
    let mut parts = spec.split('|');
    let (q, x, db, table) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
    let mut clean = Cleanup::new(amqp_url());
    let conn = connect();
    conn.declare_queue(&QueueSpec::new(clean.queue(&q)))
        .unwrap();
    conn.declare_exchange(&ExchangeSpec::new(
        clean.exchange(&x),
        acemq_amqp::ExchangeKind::Fanout,
    ))
    .unwrap();
    let path = db.clone();
    let t = clean.table(&table, move || {
        rusqlite::Connection::open(&path).map_err(|e| Error::Sql {
            context: "opening".into(),
            source: e.into(),
        })
    });
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(&format!("CREATE TABLE {t} (id INTEGER)"), [])
        .unwrap();
    panic!("deliberate panic after declaring everything");
}

#[test]
fn cleanup_deletes_what_a_panicking_test_declared() {
    let names = TestNames::current();
    let q = names.queue("child");
    let x = names.exchange("child");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("child.db");
    let table = names.table("child");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cleanup_child_declares_then_panics",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "ACEMQ_CLEANUP_CHILD",
            format!("{q}|{x}|{}|{table}", db.display()),
        )
        .output()
        .expect("run the child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the child failed: {text}");
    assert!(
        text.contains("deliberate panic after declaring everything"),
        "the child declared everything and then panicked: {text}"
    );
    assert!(
        !text.contains("acemq cleanup:"),
        "no clean-up failure: {text}"
    );

    let conn = connect();
    let e = conn.queue_info(&q).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "queue deleted: {e:?}");
    let e = conn.check_exchange(&x).unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }),
        "exchange deleted: {e:?}"
    );
    let left: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [&table],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "table dropped");
}

#[test]
fn cleanup_reports_but_does_not_panic_when_the_broker_is_unreachable() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ran = Arc::new(AtomicUsize::new(0));
    {
        let mut clean = Cleanup::new(format!("amqp://guest:guest@127.0.0.1:{port}/"))
            .deadline(Duration::from_secs(1));
        clean.queue("test.never-declared");
        let r = ran.clone();
        clean.on_drop("counting", move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        clean.on_drop("a panicking action", || panic!("in an action"));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the other actions still ran");
}

#[test]
fn cleanup_keeps_trying_when_its_first_connect_to_the_broker_hangs() {
    // A busy broker (CI's, with the whole suite running) can take longer than one connect
    // timeout to answer the clean-up; it must try again within its deadline, not leave the
    // test's queues behind.
    let proxy = proxy();
    let names = TestNames::current();
    let q = names.queue("slow-broker");
    let conn = connect();
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    proxy.hang(true);
    let mut clean = Cleanup::new(proxy.url());
    clean.queue(&q);
    let dropping = std::thread::spawn(move || drop(clean));
    wait_until(WAIT, || proxy.hung() >= 1).expect("the clean-up tried to connect");
    proxy.hang(false);
    dropping.join().unwrap();
    let e = conn.queue_info(&q).unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }),
        "the queue was deleted on a later try: {e:?}"
    );
}

#[test]
fn cleanup_leaves_an_exclusive_queue_to_the_live_connection_that_owns_it() {
    // An exclusive queue can be deleted only by its own connection, and goes with it: the
    // clean-up, on a connection of its own, gets 405 RESOURCE_LOCKED while the test's is open.
    // That is not a queue left behind, nor one to try again for the whole deadline (a test
    // declaring one spent 30 s in its clean-up, on a loaded machine long enough to fail).
    let names = TestNames::current();
    let q = names.queue("exclusive");
    let conn = connect();
    conn.declare_queue(&QueueSpec::new(&q).durable(false).exclusive(true))
        .unwrap();
    let mut clean = Cleanup::new(support::amqp_url()).deadline(Duration::from_secs(600));
    clean.queue(&q);
    let dropping = std::thread::spawn(move || drop(clean));
    wait_until(WAIT, || dropping.is_finished())
        .expect("the clean-up did not wait for a queue only its owner can delete");
    assert!(
        conn.queue_info(&q).is_ok(),
        "the owner's exclusive queue is still there while it is open"
    );
    conn.close().unwrap();
    let other = connect();
    let e = other.queue_info(&q).unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }),
        "it went with its connection: {e:?}"
    );
}

fn order(id: &str, customer: &str) -> Message {
    Message::new(format!(r#"{{"order":"{id}"}}"#))
        .with_id(format!("order-{id}"))
        .with_header("customer", customer)
}

#[test]
fn received_unit_tests_a_handler_through_idempotent_ordered_and_chain() {
    let runs = AtomicUsize::new(0);
    let inner = |m: &Message| {
        runs.fetch_add(1, Ordering::SeqCst);
        let v: serde_json::Value = m.payload()?;
        assert!(v["order"].is_string());
        Ok(Outcome::Accept)
    };

    // idempotent: a redelivery of an accepted message does not run the handler again.
    let h = idempotent(
        InMemoryIdempotencyStore::default(),
        &inner,
        IdempotentOptions::default(),
    );
    let first = received(order("1", "acme"));
    assert_eq!(h.handle(&first).unwrap(), Outcome::Accept);
    let again = received(order("1", "acme")).redelivered(true).attempt(2);
    assert!(again.received.as_ref().unwrap().redelivered);
    assert_eq!(h.handle(&again).unwrap(), Outcome::Accept);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // ordered: handle runs the handler; the key the consumer orders by is there to check.
    let h = ordered(by_header("customer"), &inner);
    let m = received(order("2", "acme"));
    assert_eq!(h.handle(&m).unwrap(), Outcome::Accept);
    let key = h.ordering().expect("ordered").key_of(&m);
    assert_eq!(key.as_deref(), Some("acme"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // chain: every layer runs on a direct call, and the ordering passes through.
    let runs_in_chain = Arc::new(AtomicUsize::new(0));
    let r = runs_in_chain.clone();
    let h = chain(
        move |m: &Message| {
            r.fetch_add(1, Ordering::SeqCst);
            if m.envelope.attempt >= 3 {
                return Ok(Outcome::reject("gave up"));
            }
            Ok(Outcome::retry("not yet"))
        },
        [
            with_logging(),
            with_idempotency(InMemoryIdempotencyStore::default()),
            with_ordering(by_header("customer")),
        ],
    );
    let m = received(order("3", "globex"));
    assert_eq!(h.handle(&m).unwrap(), Outcome::retry("not yet"));
    assert_eq!(
        h.ordering().expect("ordering passes through").key_of(&m),
        Some("globex".to_string())
    );
    // Not accepted, so the claim was given back: the retry runs again.
    let third = received(order("3", "globex")).attempt(3);
    assert_eq!(h.handle(&third).unwrap(), Outcome::reject("gave up"));
    assert_eq!(runs_in_chain.load(Ordering::SeqCst), 2);
}

#[test]
fn received_matches_what_a_consumer_hands_the_handler() {
    // The same message through the broker and through `received`: the handler sees the same.
    let conn = connect();
    let names = TestNames::current();
    let mut clean = Cleanup::new(amqp_url());
    let q = clean.consumed_queue(&names.queue("same"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let sent = Message::new("{}")
        .with_id("m-same")
        .with_type("order.placed")
        .with_header("tenant", "acme")
        .with_content_type("application/json");
    conn.publisher()
        .unwrap()
        .publish("", &q, sent.clone())
        .unwrap();
    let got = std::sync::Mutex::new(None);
    let consumer = conn
        .consumer(
            &q,
            acemq_amqp::ConsumerOptions::new().retry(acemq_amqp::RetryPolicy::none()),
        )
        .unwrap();
    let stop = consumer.stop_handle();
    std::thread::scope(|s| {
        s.spawn(|| {
            consumer
                .run(&|m: &Message| {
                    *got.lock().unwrap() = Some(m.clone());
                    stop.stop();
                    Ok(Outcome::Accept)
                })
                .unwrap()
        });
        wait_until(WAIT, || got.lock().unwrap().is_some()).expect("delivered");
    });
    let from_broker = got.into_inner().unwrap().unwrap();
    let local = received(sent).routing_key(&q);
    let mut expected = local.envelope.clone();
    expected.origin = from_broker.envelope.origin.clone(); // the publishing connection's
    assert_eq!(from_broker.envelope, expected);
    assert_eq!(from_broker.headers, local.headers);
    assert_eq!(from_broker.content_type, local.content_type);
    assert_eq!(from_broker.body, local.body);
    let (b, l) = (
        from_broker.received.unwrap(),
        local.received.clone().unwrap(),
    );
    assert_eq!(
        (b.exchange, b.routing_key, b.redelivered),
        (l.exchange, l.routing_key, l.redelivered)
    );
}

#[test]
fn test_names_are_accepted_by_the_broker() {
    let names = TestNames::new("a::module::with spaces & symbols");
    let mut clean = Cleanup::new(amqp_url());
    let conn: Connection = connect();
    let q = clean.consumed_queue(&names.queue("orders/eu"), &[Duration::from_secs(30)]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let x = clean.exchange(&names.exchange("events"));
    conn.declare_exchange(&ExchangeSpec::new(&x, acemq_amqp::ExchangeKind::Topic))
        .unwrap();
    assert!(clean.queues().contains(&format!("{q}.dlq")));
}

#[test]
fn a_consumer_on_a_queue_registered_with_cleanup_leaves_none_of_its_failure_queues() {
    // A consumer declares `{q}.dlq` and `{q}.parked` beside its queue (and a rung per broker
    // wait of its policy): registering the queue with `Cleanup::queue` deletes the first two,
    // `Cleanup::consumed_queue` with the policy's rungs deletes the rungs as well.
    let names = TestNames::current();
    let conn = connect();
    let policy = acemq_amqp::RetryPolicy::fixed(2, Duration::from_secs(30));
    let (plain, with_rungs) = {
        let mut clean = Cleanup::new(amqp_url());
        let plain = clean.queue(&names.queue("plain"));
        let with_rungs = clean.consumed_queue(&names.queue("rungs"), &policy.broker_rungs());
        for (q, retry) in [
            (&plain, acemq_amqp::RetryPolicy::none()),
            (&with_rungs, policy.clone()),
        ] {
            conn.declare_queue(&QueueSpec::new(q)).unwrap();
            let consumer = conn
                .consumer(q, acemq_amqp::ConsumerOptions::new().retry(retry))
                .unwrap();
            drop(consumer);
        }
        for q in [
            format!("{plain}.dlq"),
            format!("{plain}.parked"),
            format!("{with_rungs}.retry.30s"),
        ] {
            conn.queue_info(&q)
                .unwrap_or_else(|e| panic!("the consumer declared {q}: {e:?}"));
        }
        (plain, with_rungs)
    };
    let mut left = Vec::new();
    for q in [
        plain.clone(),
        format!("{plain}.dlq"),
        format!("{plain}.parked"),
        with_rungs.clone(),
        format!("{with_rungs}.dlq"),
        format!("{with_rungs}.parked"),
        format!("{with_rungs}.retry.30s"),
    ] {
        match conn.queue_info(&q) {
            Err(Error::NotFound { .. }) => {}
            other => left.push(format!("{q}: {other:?}")),
        }
    }
    assert!(left.is_empty(), "left behind after the clean-up: {left:?}");
}
