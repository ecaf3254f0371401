//! Pipeline (`then`) test steps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::pipeline::{then, Next};
use acemq_amqp::{Connection, ConsumerOptions, Message, Publisher, RetryPolicy, RunningConsumer};

/// A step on `input` whose next hop is `next_queue` through the default exchange, three
/// attempts 100 ms apart, and the attempt of each call it got.
pub fn step_to(
    conn: &Connection,
    input: &str,
    next_queue: String,
    publisher: Publisher,
) -> (RunningConsumer, Arc<Mutex<Vec<u32>>>) {
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a = attempts.clone();
    let step = then(publisher, "", next_queue, move |m: &Message| {
        a.lock().unwrap().push(m.envelope.attempt);
        Ok(Next::Publish(serde_json::json!({"next": true})))
    });
    let stepping = conn
        .consumer(
            input,
            ConsumerOptions::new()
                .retry(RetryPolicy::fixed(3, Duration::from_millis(100)).jitter(0.0)),
        )
        .unwrap()
        .start(step)
        .unwrap();
    (stepping, attempts)
}
