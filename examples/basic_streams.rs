//! Streams: an append-only event log that keeps its messages after they are read. Two readers
//! each read the whole log from the first offset; a third starts at an offset it stored (how a
//! reader resumes: RabbitMQ does not track offsets for AMQP 0-9-1 readers).
//! Run: `cargo run --example basic_streams`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::streams::{
    declare_stream, stream_offset_of, Offset, StreamOptions, StreamReader,
};
use acemq_amqp::{Message, Outcome, Result, StreamRetention};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn read(
    connection: &acemq_amqp::Connection,
    log: &str,
    from: Offset,
    n: usize,
) -> Result<Vec<String>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let reader = StreamReader::new(connection, log, StreamOptions::new().offset(from)).and_then(
        |reader| {
            reader.start(move |m: &Message| {
                let at = stream_offset_of(m).unwrap_or_default();
                s.lock()
                    .expect("seen")
                    .push(format!("{at}:{}", String::from_utf8_lossy(&m.body)));
                Ok(Outcome::Accept)
            })
        },
    )?;
    ex::wait_for("the events", || seen.lock().expect("seen").len() >= n);
    reader.close()?;
    let seen = seen.lock().expect("seen").clone();
    Ok(seen)
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let log = ex::name("account-events");
    // Retention is unbounded unless you bound it: here, an hour.
    declare_stream(
        &connection,
        &log,
        StreamRetention::default().max_age(Duration::from_secs(3600)),
    )?;
    let publisher = connection.publisher()?;
    for event in ["opened", "deposited 100", "withdrew 30", "deposited 5"] {
        publisher.publish("", &log, Message::new(event))?;
    }
    println!("appended 4 events to the stream {log}");
    println!(
        "reader 1 from the first offset: {:?}",
        read(&connection, &log, Offset::First, 4)?
    );
    println!(
        "reader 2 from the first offset: {:?} (reading removed nothing)",
        read(&connection, &log, Offset::First, 4)?
    );
    println!(
        "reader 3 resuming after stored offset 1: {:?}",
        read(&connection, &log, Offset::At(2), 2)?
    );
    ex::delete_queues(&connection, &[&log])?;
    connection.close()
}
