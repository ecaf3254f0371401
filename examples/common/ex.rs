//! What the `basic_*`, `intermediate_*` and `advanced_*` examples share: the broker address, a
//! name of their own per run, a wait with a deadline, and cleaning up what they declared.
#![allow(dead_code)] // each example uses part of it

use std::time::{Duration, Instant};

use acemq_amqp::{Connection, Result};

/// `ACEMQ_AMQP_URL`, or the local broker's guest account.
pub fn url() -> String {
    std::env::var("ACEMQ_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into())
}

/// Connects to the broker.
pub fn connect() -> Result<Connection> {
    Connection::open(&url())
}

/// `example.{what}.{pid}`: a name no other run uses.
pub fn name(what: &str) -> String {
    format!("example.{what}.{}", std::process::id())
}

/// Waits up to 30 s for `done`, checking every 20 ms; panics with `what` if it never comes.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes each queue and the `.dlq` / `.parked` queues a consumer declares beside it (missing
/// ones are fine).
pub fn delete_queues(connection: &Connection, queues: &[&str]) -> Result<()> {
    for q in queues {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    Ok(())
}
