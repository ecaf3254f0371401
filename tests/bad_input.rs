//! Bad input the README's table lists and no other file tests (issue 17): zero sizes, the
//! largest prefetch, a body the codec cannot read. Each row of the table names its test.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::patterns::acknowledged::{Batcher, BatcherOptions};
use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::patterns::outbox::{InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions};
use acemq_amqp::patterns::replay::{replay, ReplayOptions};
use acemq_amqp::patterns::request_reply::{Requester, RequesterOptions};
use acemq_amqp::{
    parked_queue, ConnectionOptions, ConsumerOptions, Error, Message, Outcome, PublisherOptions,
};
use support::eventually;

const WAIT: Duration = Duration::from_secs(20);

fn accept(_: &Message) -> acemq_amqp::HandlerResult {
    Ok(Outcome::Accept)
}

fn is_invalid<T: std::fmt::Debug>(what: &str, r: acemq_amqp::Result<T>) {
    match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// Every size or count of zero is refused with `Error::InvalidArgument` before anything is
/// sent: no consumer appears on the queue, no channel is opened for it.
#[test]
fn zero_sizes_are_refused_before_anything_is_sent() {
    let (conn, _clean, q) = support::declared_consumed_queue("bad-zero");

    is_invalid(
        "prefetch 0",
        conn.consumer(&q, ConsumerOptions::new().prefetch(0))
            .and_then(|c| c.start(accept)),
    );
    is_invalid(
        "concurrency 0",
        conn.consumer(&q, ConsumerOptions::new().concurrency(0))
            .and_then(|c| c.start(accept)),
    );
    is_invalid(
        "a group of 0",
        ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(0))
            .and_then(|group| group.start(accept)),
    );
    is_invalid(
        "publisher window 0",
        conn.publisher_with(PublisherOptions::new().window(0)),
    );
    is_invalid(
        "relay batch size 0",
        OutboxRelay::new(
            &conn,
            InMemoryOutboxStore::new(),
            OutboxRelayOptions::new().batch_size(0),
        ),
    );
    is_invalid(
        "requester window 0",
        Requester::new(&conn, RequesterOptions::new().window(0).routing_key(&q))
            .and_then(Requester::start),
    );
    is_invalid(
        "requester timeout 0",
        Requester::new(
            &conn,
            RequesterOptions::new()
                .timeout(Duration::ZERO)
                .routing_key(&q),
        )
        .and_then(Requester::start),
    );
    is_invalid(
        "replay window 0",
        replay(&conn, &q, ReplayOptions::default().window(0)).run(),
    );
    is_invalid(
        "batch size 0",
        Batcher::new(BatcherOptions::new().batch_size(0).max_pending(10)),
    );
    is_invalid(
        "max pending 0",
        Batcher::new(BatcherOptions::new().batch_size(10).max_pending(0)),
    );
    match acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .max_unconfirmed_bytes(0),
    ) {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("max_unconfirmed_bytes 0: expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(
        conn.queue_info(&q).unwrap().consumer_count,
        0,
        "nothing started"
    );
}

/// The largest prefetch AMQP has (65535; a larger one does not compile: `u16`) is accepted and
/// still bounds what is buffered; messages flow.
#[test]
fn the_largest_prefetch_is_accepted() {
    let (conn, _clean, q) = support::declared_consumed_queue("bad-prefetch");
    support::publish_n(&conn, &q, 100, false);
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().prefetch(u16::MAX))
        .unwrap()
        .start(move |_: &Message| {
            d.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || done.load(Ordering::SeqCst) == 100));
    consumer.close().unwrap();
}

#[derive(serde::Deserialize, Debug)]
#[allow(dead_code)] // only decoded
struct Order {
    id: u64,
}

/// A body the codec cannot read (`payload::<T>()?` in the handler) is parked at once with the
/// family's text, `could not be decoded: …`; it is not retried.
#[test]
fn a_garbage_body_for_the_codec_is_parked_as_undecodable() {
    let (conn, _clean, q) = support::declared_consumed_queue("bad-body");
    let (calls, handler) = support::counted(|m: &Message| {
        let _order: Order = m.payload()?;
        Ok(Outcome::Accept)
    });
    let retry = acemq_amqp::RetryPolicy::fixed(5, Duration::from_millis(10));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(retry))
        .unwrap()
        .start(handler)
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish(
            "",
            &q,
            Message::new(b"\xff{not json".to_vec()).with_content_type("application/json"),
        )
        .unwrap();
    let parked = parked_queue(&q);
    assert!(eventually(WAIT, || conn
        .queue_info(&parked)
        .map(|i| i.message_count == 1)
        .unwrap_or(false)));
    consumer.close().unwrap();
    let m = conn.get(&parked).unwrap().expect("the parked copy");
    let error = m.envelope.error.clone().unwrap_or_default();
    assert!(
        error.starts_with("could not be decoded: "),
        "the family's text: {error}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried");
}
