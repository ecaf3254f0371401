//! Handlers that ask for batches (`Handler::batch_limits` / `handle_batch`): the consumer's
//! worker gathers them, each message is settled as if handled alone, and a batch that fails as
//! a whole is every message's failure.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::{dead_letter_queue, ConsumerOptions, Handler, HandlerResult, Message, Outcome};
use support::{eventually, publish_n};

const WAIT: Duration = Duration::from_secs(30);

/// Records each batch's size; answers with `answer`.
struct Batches {
    max: usize,
    sizes: Arc<Mutex<Vec<usize>>>,
    answer: fn(&[&Message]) -> Vec<std::thread::Result<HandlerResult>>,
}

impl Handler for Batches {
    fn handle(&self, _: &Message) -> HandlerResult {
        panic!("a batching handler is given batches")
    }
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        Some((self.max, Duration::from_millis(50)))
    }
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.sizes.lock().unwrap().push(messages.len());
        (self.answer)(messages)
    }
}

fn run(
    n: usize,
    max: usize,
    prefetch: u16,
    answer: fn(&[&Message]) -> Vec<std::thread::Result<HandlerResult>>,
) -> (Vec<usize>, usize, usize) {
    let (conn, _clean, q) = support::declared_consumed_queue("batches");
    publish_n(&conn, &q, n, false);
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .prefetch(prefetch)
                .retry(acemq_amqp::RetryPolicy::none()),
        )
        .unwrap()
        .start(Batches {
            max,
            sizes: sizes.clone(),
            answer,
        })
        .unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(eventually(WAIT, || {
        let handled: usize = sizes.lock().unwrap().iter().sum();
        handled == n && conn.queue_info(&q).unwrap().message_count == 0
    }));
    consumer.close().unwrap();
    let left = conn.queue_info(&q).unwrap().message_count as usize;
    let dead = conn.queue_info(&dlq).unwrap().message_count as usize;
    let sizes = sizes.lock().unwrap().clone();
    (sizes, left, dead)
}

#[test]
fn a_worker_gathers_batches_up_to_the_limit_and_its_share_of_the_prefetch() {
    let (sizes, left, dead) = run(50, 8, 100, |ms| {
        ms.iter().map(|_| Ok(Ok(Outcome::Accept))).collect()
    });
    assert_eq!(sizes.iter().sum::<usize>(), 50);
    assert!(sizes.iter().all(|&s| s <= 8), "{sizes:?}");
    assert!(sizes.iter().any(|&s| s > 1), "batched: {sizes:?}");
    assert_eq!((left, dead), (0, 0), "all acknowledged");

    // A prefetch of 4 caps a batch at 4 whatever the handler asks for.
    let (sizes, _, _) = run(20, 16, 4, |ms| {
        ms.iter().map(|_| Ok(Ok(Outcome::Accept))).collect()
    });
    assert!(sizes.iter().all(|&s| s <= 4), "{sizes:?}");
}

#[test]
fn each_message_of_a_batch_goes_its_own_way() {
    // Every second message rejected: those alone reach the dead-letter queue.
    let (_, left, dead) = run(10, 10, 20, |ms| {
        ms.iter()
            .map(|m| {
                let n: usize = String::from_utf8_lossy(&m.body).parse().unwrap();
                Ok(Ok(if n.is_multiple_of(2) {
                    Outcome::Accept
                } else {
                    Outcome::reject("odd")
                }))
            })
            .collect()
    });
    assert_eq!((left, dead), (0, 5));
}

#[test]
fn a_batch_that_panics_or_answers_wrongly_fails_every_message() {
    let (_, left, dead) = run(6, 6, 10, |_| panic!("the whole batch panicked"));
    assert_eq!(
        (left, dead),
        (0, 6),
        "each retried (no retries: dead-lettered)"
    );
    let (_, left, dead) = run(6, 6, 10, |_| vec![Ok(Ok(Outcome::Accept))]);
    assert_eq!(
        (left, dead),
        (0, 6),
        "a wrong number of results fails them all"
    );
}
