//! Raw amiquip baselines shared by the benchmarks: what a careful user of amiquip alone would
//! write (TCP_NODELAY set, confirms counted with amiquip's smoother, one ack per delivery).
#![allow(dead_code)] // each benchmark uses a part

use std::time::{Duration, Instant};

use amiquip::{
    AmqpProperties, Auth, Confirm, ConfirmSmoother, ConnectionOptions, ConnectionTuning,
    ConsumerMessage, Publish,
};

/// The broker the benchmarks use: `ACEMQ_AMQP_URL`, or the local broker's guest account (the
/// examples' setting, so `scripts/test` can run them against a second broker).
pub fn amqp_url() -> String {
    std::env::var("ACEMQ_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into())
}

/// `host:port` of [`amqp_url`], for raw amiquip's socket.
pub fn broker_addr() -> String {
    let url = amqp_url();
    acemq_amqp::Address::parse(&url)
        .unwrap_or_else(|e| panic!("ACEMQ_AMQP_URL {url:?} cannot be read: {e}"))
        .host_port()
}

/// An amiquip connection to the broker ([`amqp_url`]) with TCP_NODELAY, as guest.
pub fn raw_connection() -> amiquip::Connection {
    let addr = broker_addr();
    let s =
        std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("RabbitMQ at {addr}: {e}"));
    s.set_nodelay(true).expect("nodelay");
    amiquip::Connection::insecure_open_stream(
        mio::net::TcpStream::from_stream(s).expect("mio stream"),
        ConnectionOptions::<Auth>::default(),
        ConnectionTuning::default(),
    )
    .expect("open amiquip connection")
}

/// Publishes `n` copies of `body` with `props` to `queue` in windows of `window` confirms.
pub fn raw_publish(
    queue: &str,
    n: usize,
    window: usize,
    body: &[u8],
    props: &AmqpProperties,
) -> Duration {
    let mut conn = raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    let confirms = ch.listen_for_publisher_confirms().expect("confirms");
    ch.enable_publisher_confirms().expect("confirm mode");
    let mut smoother = ConfirmSmoother::new();
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let batch = window.min(n - sent);
        for _ in 0..batch {
            ch.basic_publish("", Publish::with_properties(body, queue, props.clone()))
                .expect("publish");
        }
        let mut acked = 0;
        while acked < batch {
            for c in smoother.process(confirms.recv().expect("confirm")) {
                assert!(matches!(c, Confirm::Ack(_)));
                acked += 1;
            }
        }
        sent += batch;
    }
    let took = start.elapsed();
    conn.close().expect("close");
    took
}

/// Consumes and acknowledges (one ack per delivery) `n` messages from `queue`.
pub fn raw_consume(queue: &str, n: usize, prefetch: u16) -> Duration {
    raw_consume_with(queue, n, prefetch, || {})
}

/// [`raw_consume`] running `work` on the consuming thread before each ack (a handler).
pub fn raw_consume_with(queue: &str, n: usize, prefetch: u16, mut work: impl FnMut()) -> Duration {
    let mut conn = raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    ch.qos(0, prefetch, false).expect("qos");
    let start = Instant::now();
    let consumer = ch
        .basic_consume(queue, Default::default())
        .expect("consume");
    let mut got = 0;
    for m in consumer.receiver().iter() {
        if let ConsumerMessage::Delivery(d) = m {
            work();
            d.ack(&ch).expect("ack");
            got += 1;
            if got == n {
                break;
            }
        }
    }
    let took = start.elapsed();
    // amiquip drops the whole connection if a consumer's receiver is gone before it delivers
    // `ClientCancelled`: cancel, read up to it, then drop.
    consumer.cancel().expect("cancel");
    for m in consumer.receiver().iter() {
        if !matches!(m, ConsumerMessage::Delivery(_)) {
            break;
        }
    }
    drop(consumer);
    conn.close().expect("close");
    took
}

/// Fills `queue` with `n` transient messages through acemq's publisher (so both sides of a
/// consume benchmark read the same frames); `body(i)` makes the i-th body.
pub fn fill_queue(
    conn: &acemq_amqp::Connection,
    queue: &str,
    n: usize,
    body: impl Fn(usize) -> Vec<u8>,
) -> acemq_amqp::Result<()> {
    let p = conn.publisher_with(acemq_amqp::PublisherOptions::new().window(2000))?;
    let mut tickets = Vec::with_capacity(1000);
    for i in 0..n {
        let m = acemq_amqp::Message::new(body(i)).with_persistent(false);
        tickets.push(p.publish_deferred("", queue, m)?);
        if tickets.len() == 1000 {
            for t in tickets.drain(..) {
                t.wait()?;
            }
        }
    }
    for t in tickets {
        t.wait()?;
    }
    p.close()
}
