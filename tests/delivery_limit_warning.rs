//! A consumer whose queue can lose messages to RabbitMQ 4.x's quorum delivery limit (a quorum
//! queue with no dead-letter target) says so once at start, with the two mends; one whose queue
//! has the family's dead-letter form says nothing, and on RabbitMQ 3.x (no default delivery
//! limit) neither does; a transient queue that is not exclusive is warned about once. Alone in
//! its binary: it installs the process's logger.

mod support;

use std::sync::Mutex;

use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec};
use support::{broker_major, unique};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;
impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.level() <= log::Level::Warn {
            LINES.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn warnings_about(queue: &str) -> Vec<String> {
    let q = format!("{queue:?}");
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&q) && l.contains("delivery limit"))
        .cloned()
        .collect()
}

#[test]
fn a_consumer_of_a_quorum_queue_without_a_dead_letter_target_warns_once_on_rabbitmq_4() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let (conn, mut clean, bare) = support::declared_consumed_queue("dlw-bare");
    let guarded = clean.consumed_queue(&unique("dlw-guarded"), &[]);
    conn.declare_queue(&QueueSpec::new(&guarded).with_dead_letter())
        .unwrap();
    for _ in 0..2 {
        for q in [&bare, &guarded] {
            conn.consumer(q, ConsumerOptions::new())
                .unwrap()
                .start(|_: &Message| Ok(Outcome::Accept))
                .unwrap()
                .close()
                .unwrap();
        }
    }
    // A transient queue that is not exclusive: deprecated by RabbitMQ (4.0 logs it, 4.3 refuses
    // it by default), said once whatever the major.
    let transient = clean.queue(&unique("dlw-transient"));
    for _ in 0..2 {
        conn.declare_queue(&QueueSpec::new(&transient).durable(false))
            .unwrap();
    }
    let said: Vec<String> = LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&format!("{transient:?}")) && l.contains("transient_nonexcl_queues"))
        .cloned()
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        warnings_about(&guarded).is_empty(),
        "{:?}",
        warnings_about(&guarded)
    );
    let bare_warnings = warnings_about(&bare);
    if broker_major() >= 4 {
        assert_eq!(bare_warnings.len(), 1, "once: {bare_warnings:?}");
        let w = &bare_warnings[0];
        for mend in ["with_dead_letter", "policy", "drops", ".dlq"] {
            assert!(w.contains(mend), "{mend} in {w}");
        }
        assert_eq!(conn.broker_major(), Some(broker_major()));
    } else {
        // RabbitMQ 3.x: quorum queues have no delivery limit unless one is set.
        assert!(bare_warnings.is_empty(), "{bare_warnings:?}");
    }
}
