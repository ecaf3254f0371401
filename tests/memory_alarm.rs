//! A broker memory alarm (`connection.blocked`): the broker stops reading from publishing
//! connections. Its own test binary — cargo runs test binaries one at a time, so the alarm
//! cannot stall other tests — and the watermark is restored on every exit path (a guard that
//! runs on panic too). One test only: two alarms in one binary would overlap.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::ConnectionEvent;
use acemq_amqp::{ConnectionOptions, Message, Observer, PublisherOptions, QueueSpec};
use support::{amqp_url, eventually, rabbitmqctl, unique, Cleanup};

/// Restores the broker's memory watermark when dropped. Holds an exclusive lock on a file
/// while the alarm is on, so that two runs on one machine (two checkouts testing against the
/// same broker) take turns instead of restoring each other's alarm.
struct Watermark {
    previous: String,
    _lock: std::fs::File,
}

impl Watermark {
    fn alarm() -> Watermark {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("acemq-memory-alarm.lock"))
            .expect("the memory alarm's lock file");
        lock.lock().expect("the memory alarm's lock");
        let out = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]);
        let mut previous = out.trim().to_string();
        let value: f64 = previous
            .parse()
            .unwrap_or_else(|_| panic!("the current watermark: {previous:?}"));
        if value < 0.01 {
            // An alarm left behind by a run that was killed: restore RabbitMQ's default.
            previous = "0.4".into();
        }
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0001"]);
        Watermark {
            previous,
            _lock: lock,
        }
    }
}

impl Drop for Watermark {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", &self.previous])
            .output();
    }
}

/// Records the blocked / unblocked notices.
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

impl Observer for Notices {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        match event {
            ConnectionEvent::Blocked { reason } => {
                self.0.lock().unwrap().push(format!("blocked: {reason}"))
            }
            ConnectionEvent::Unblocked => self.0.lock().unwrap().push("unblocked".into()),
            _ => {}
        }
    }
}

#[test]
fn under_a_memory_alarm_publishing_is_reported_blocked_and_recovers_after_it() {
    let notices = Notices::default();
    let conn = ConnectionOptions::new()
        .address(amqp_url())
        .observer(notices.clone())
        .open()
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable ({e}): run `scripts/test`"));
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("memory-alarm"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let timeout = Duration::from_secs(1);
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    assert!(!publisher.is_blocked() && !conn.is_blocked());
    let alarm = Watermark::alarm();
    let body = vec![b'x'; 1 << 20];
    let mut tickets = Vec::new();
    let mut blocked = 0;
    // 20 MiB: more than amiquip buffers (16 MiB) before it would block a publishing thread.
    for i in 0..20 {
        let started = Instant::now();
        match publisher.publish_deferred("", &q, Message::new(body.clone())) {
            Ok(t) => tickets.push(t),
            Err(e) => {
                assert!(
                    matches!(&e, acemq_amqp::Error::Blocked { after, .. } if *after == timeout),
                    "{e}"
                );
                assert!(e.is_retriable() && e.is_timeout(), "{e}");
                assert!(e.to_string().contains("blocking publishing"), "{e}");
                blocked += 1;
            }
        }
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_secs(3),
            "publish {i} took {took:?}"
        );
    }
    assert!(blocked > 0, "the alarm held publishes back");
    assert!(!tickets.is_empty());
    assert!(publisher.is_blocked() && conn.is_blocked());
    let reason = conn.blocked_reason().expect("the broker's reason");
    assert!(
        notices
            .0
            .lock()
            .unwrap()
            .contains(&format!("blocked: {reason}")),
        "{:?}",
        notices.0.lock().unwrap()
    );
    let _ = format!("{publisher:?} {}", publisher.in_flight());
    drop(alarm);
    // The alarm is over: reported, and what was handed over is confirmed.
    assert!(eventually(Duration::from_secs(30), || !conn.is_blocked()));
    assert!(notices.0.lock().unwrap().contains(&"unblocked".to_string()));
    for t in tickets {
        t.wait_timeout(Duration::from_secs(30))
            .expect("confirmed after the alarm");
    }
    publisher.publish("", &q, Message::new("after")).unwrap();
}
