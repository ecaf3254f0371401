//! A blocked broker: RabbitMQ stops reading from publishing connections when it runs short of
//! memory or disk (`connection.blocked`). This example raises a memory alarm on the local broker
//! (`rabbitmqctl set_vm_memory_high_watermark`), shows the library reporting it — the observer's
//! `Blocked` event, `is_blocked()`, a publish that gives up with a retriable `Error::Blocked`
//! instead of hanging — then clears the alarm and shows what was handed over confirmed.
//! Run: `cargo run --example advanced_blocked_broker` (it needs `rabbitmqctl`; the watermark is
//! restored on every exit path, and a lock file keeps it from overlapping the memory-alarm test).

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::ConnectionEvent;
use acemq_amqp::observe::Observer;
use acemq_amqp::{ConnectionOptions, Message, PublisherOptions, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

/// The broker's memory alarm, raised while this lives (and restored when it is dropped, also
/// on a panic).
struct Alarm {
    previous: String,
    _lock: std::fs::File,
}

impl Alarm {
    fn raise() -> std::io::Result<Alarm> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("acemq-memory-alarm.lock"))?;
        lock.lock()?;
        let out = Command::new("rabbitmqctl")
            .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
            .output()?;
        let mut previous = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if previous.parse::<f64>().map_or(true, |v| v < 0.01) {
            previous = "0.4".into(); // RabbitMQ's default, if a killed run left an alarm behind
        }
        Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", "0.0001"])
            .output()?;
        Ok(Alarm {
            previous,
            _lock: lock,
        })
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", &self.previous])
            .output();
    }
}

#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

impl Observer for Notices {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        let line = match event {
            ConnectionEvent::Blocked { reason } => format!("blocked: {reason}"),
            ConnectionEvent::Unblocked => "unblocked".to_string(),
            _ => return,
        };
        println!("  observer: {line}");
        self.0.lock().expect("notices").push(line);
    }
}

fn example() -> Result<()> {
    let notices = Notices::default();
    let connection = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(ex::url())
            .observer(notices.clone()),
    )?;
    let queue = ex::name("blocked");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let publisher =
        connection.publisher_with(PublisherOptions::new().timeout(Duration::from_secs(1)))?;
    publisher.publish("", &queue, Message::new("before the alarm"))?;
    println!(
        "published before the alarm; blocked: {}",
        connection.is_blocked()
    );

    let alarm = Alarm::raise().map_err(|e| acemq_amqp::Error::Io {
        context: "raising a memory alarm with rabbitmqctl".into(),
        source: e,
    })?;
    println!("memory alarm raised: the broker stops reading from publishers");
    let mut tickets = Vec::new();
    let body = vec![b'x'; 1 << 20];
    for _ in 0..20 {
        let started = Instant::now();
        match publisher.publish_deferred("", &queue, Message::new(body.clone())) {
            Ok(ticket) => tickets.push(ticket),
            Err(e) => {
                println!(
                    "  a publish gave up after {:?}: {e} (retriable: {})",
                    started.elapsed(),
                    e.is_retriable()
                );
                break;
            }
        }
    }
    println!(
        "blocked: {} (the broker's reason: {:?}); {} publishes handed over and waiting",
        connection.is_blocked(),
        connection.blocked_reason().unwrap_or_default(),
        tickets.len()
    );
    drop(alarm);
    println!("alarm cleared");
    ex::wait_for("the broker to unblock", || !connection.is_blocked());
    let handed = tickets.len();
    for ticket in tickets {
        ticket.wait_timeout(Duration::from_secs(30))?;
    }
    println!("all {handed} handed-over publishes confirmed; nothing was lost");
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
