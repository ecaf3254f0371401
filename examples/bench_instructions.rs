//! The fixed workloads `scripts/bench-instructions` counts instructions of (issue 49): one
//! workload per process, on a queue of its own, so that `valgrind --tool=callgrind` over the
//! whole process gives its instruction count. Not a benchmark on its own: it prints nothing but
//! what it did, and times nothing.
//!
//! ```text
//! bench_instructions publish QUEUE N   # N × 200 B persistent, Publisher, confirms in windows of 100
//! bench_instructions consume QUEUE N   # a Consumer (prefetch 100, concurrency 1) takes and acks N
//! bench_instructions rpc QUEUE N       # N round trips, Requester → Responder, both in this process
//! bench_instructions fill QUEUE N      # puts N messages on QUEUE for `consume` (not measured)
//! ```
//!
//! Each declares QUEUE (classic) and deletes it at the end (`fill` leaves it for `consume`);
//! N = 0 is the baseline: the same connect, declare, set-up, close and delete with no message.
//! The script copies this file into the base revision's worktree as well, so it uses only public
//! API that is the same on both sides of the transport refactor (6df3d7d and later).
//! RabbitMQ at ACEMQ_AMQP_URL or amqp://guest:guest@127.0.0.1:5672.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::{
    BoxError, Connection, ConsumerOptions, Error, Message, Outcome, PublisherOptions, QueueSpec,
    Result,
};

const BODY: [u8; 200] = [b'x'; 200];
const WINDOW: usize = 100;

fn url() -> String {
    std::env::var("ACEMQ_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

/// `n` messages through a publisher with confirms awaited per `window`.
fn publish(conn: &Connection, queue: &str, n: usize, window: usize) -> Result<()> {
    let publisher = conn.publisher_with(PublisherOptions::new().window(window))?;
    let mut tickets = Vec::with_capacity(window);
    let mut sent = 0;
    while sent < n {
        let batch = window.min(n - sent);
        for _ in 0..batch {
            tickets.push(publisher.publish_deferred("", queue, Message::new(&BODY[..]))?);
        }
        for t in tickets.drain(..) {
            t.wait()?;
        }
        sent += batch;
    }
    publisher.close()
}

fn consume(conn: &Connection, queue: &str, n: usize) -> Result<()> {
    let (tx, rx) = mpsc::sync_channel(1);
    let count = AtomicUsize::new(0);
    let handler = move |_: &Message| {
        if count.fetch_add(1, Ordering::Relaxed) + 1 == n {
            let _ = tx.try_send(());
        }
        Ok(Outcome::Accept)
    };
    let options = ConsumerOptions::new()
        .prefetch(100)
        .concurrency(1)
        .declare(false);
    let consumer = conn.consumer(queue, options)?.start(handler)?;
    if n > 0 {
        rx.recv_timeout(Duration::from_secs(1800))
            .map_err(|_| Error::Closed {
                what: "bench_instructions consume",
            })?;
    }
    consumer.close()?;
    Ok(())
}

fn rpc(conn: &Connection, queue: &str, n: usize) -> Result<()> {
    let server = Connection::open(&url())?;
    let responder = Responder::new(
        &server,
        queue,
        ResponderOptions::new().consumer(ConsumerOptions::new().declare(false)),
    )?
    .start(|_: &Message| Ok::<_, BoxError>(&b"{\"price\":12.5}"[..]))?;
    let requester = Requester::new(conn, RequesterOptions::new().routing_key(queue))?.start()?;
    for _ in 0..n {
        requester.ask(Message::new(&b"{\"sku\":\"A-1\"}"[..]).with_persistent(false))?;
    }
    requester.close()?;
    responder.close()?;
    server.close()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> Result<()> {
        eprintln!("usage: bench_instructions publish|consume|rpc|fill QUEUE N");
        std::process::exit(2)
    };
    let [mode, queue, n] = &args[..] else {
        return usage();
    };
    let Ok(n) = n.parse::<usize>() else {
        return usage();
    };
    let conn = Connection::open(&url())?;
    conn.declare_queue(&QueueSpec::new(queue).classic())?;
    match mode.as_str() {
        "fill" => return publish(&conn, queue, n, 1000).and_then(|()| conn.close()),
        "publish" => publish(&conn, queue, n, WINDOW)?,
        "consume" => consume(&conn, queue, n)?,
        "rpc" => rpc(&conn, queue, n)?,
        _ => return usage(),
    }
    conn.delete_queue(queue)?;
    conn.close()?;
    println!("{mode} {queue} {n}: done");
    Ok(())
}
