//! A broker memory alarm (`connection.blocked`): the broker stops reading from publishing
//! connections. Its own test binary — cargo runs test binaries one at a time, so the alarm
//! cannot stall other tests — and the watermark is restored on every exit path (a guard that
//! runs on panic too).

mod support;

use std::time::{Duration, Instant};

use acemq_amqp::{Message, PublisherOptions, QueueSpec};
use support::{connect, rabbitmqctl, unique, Cleanup};

/// Restores the broker's memory watermark when dropped.
struct Watermark(String);

impl Watermark {
    fn alarm() -> Watermark {
        let out = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]);
        let previous = out.trim().to_string();
        assert!(
            previous.parse::<f64>().is_ok(),
            "the current watermark: {previous:?}"
        );
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0001"]);
        Watermark(previous)
    }
}

impl Drop for Watermark {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", &self.0])
            .output();
    }
}

#[test]
fn under_a_memory_alarm_publishes_time_out_on_time_and_confirms_flow_after_it() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("memory-alarm"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let timeout = Duration::from_secs(1);
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    let alarm = Watermark::alarm();
    let body = vec![b'x'; 1 << 20];
    let mut tickets = Vec::new();
    let mut timed_out = 0;
    // 20 MiB: more than amiquip buffers (16 MiB) before it would block a publishing thread.
    for i in 0..20 {
        let started = Instant::now();
        match publisher.publish_deferred("", &q, Message::new(body.clone())) {
            Ok(t) => tickets.push(t),
            Err(e) => {
                assert!(matches!(e, acemq_amqp::Error::Timeout { .. }), "{e}");
                timed_out += 1;
            }
        }
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_secs(3),
            "publish {i} took {took:?}"
        );
    }
    assert!(timed_out > 0, "the alarm held publishes back");
    assert!(!tickets.is_empty());
    let _ = format!("{publisher:?} {}", publisher.in_flight());
    drop(alarm);
    // The alarm is over: what was handed over is confirmed.
    for t in tickets {
        t.wait_timeout(Duration::from_secs(30))
            .expect("confirmed after the alarm");
    }
    publisher.publish("", &q, Message::new("after")).unwrap();
}
