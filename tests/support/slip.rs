//! Routing-slip test steps: queues, a recording step that appends its name to the body.

use std::sync::{Arc, Mutex};

use acemq_amqp::patterns::routing_slip::{follow_slip, FollowSlipOptions};
use acemq_amqp::testing::Cleanup;
use acemq_amqp::{
    BoxError, Connection, ConsumerOptions, Message, QueueSpec, RetryPolicy, RunningConsumer,
};

/// What a step saw: its name, the message id, correlation, causation, body.
pub type Seen = Arc<Mutex<Vec<(String, String, String, Option<String>, Vec<u8>)>>>;

/// Records what step `name` saw of `m`.
pub fn record(seen: &Seen, name: &str, m: &Message) {
    seen.lock().unwrap().push((
        name.to_string(),
        m.id().to_string(),
        m.envelope.correlation_id.clone().unwrap_or_default(),
        m.envelope.causation_id.clone(),
        m.body.clone(),
    ));
}

/// Classic queues named exactly `names`, `.dlq` / `.parked` cleaned up.
pub fn queues(conn: &Connection, clean: &mut Cleanup, names: &[String]) {
    for q in names {
        clean.consumed_queue(q, &[]);
        conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    }
}

/// A step on `queue` that records what it saw and appends `+name` to the body.
pub fn step(
    conn: &Connection,
    publisher: &acemq_amqp::Publisher,
    queue: &str,
    name: &str,
    seen: &Seen,
) -> RunningConsumer {
    let (seen, name) = (seen.clone(), name.to_string());
    let handler = follow_slip(
        publisher,
        move |m: &Message| {
            record(&seen, &name, m);
            let mut body = m.body.clone();
            body.extend_from_slice(format!("+{name}").as_bytes());
            Ok::<_, BoxError>(Some(Message::new(body)))
        },
        FollowSlipOptions::new(),
    );
    conn.consumer(queue, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(handler)
        .unwrap()
}

/// A step on `queue` (retried by `retry`) that only counts its runs and forwards nothing, and
/// the count.
pub fn counting_step(
    conn: &Connection,
    publisher: &acemq_amqp::Publisher,
    queue: &str,
    retry: RetryPolicy,
) -> (RunningConsumer, Arc<std::sync::atomic::AtomicUsize>) {
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = ran.clone();
    let handler = follow_slip(
        publisher,
        move |_: &Message| {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, BoxError>(None)
        },
        FollowSlipOptions::new(),
    );
    let consumer = conn
        .consumer(queue, ConsumerOptions::new().retry(retry))
        .unwrap()
        .start(handler)
        .unwrap();
    (consumer, ran)
}
