//! The consumer group against the real broker: a start that runs out of the connection's
//! channels closes the members already running; a group of zero is refused. The scenarios that
//! run the same on the `memory://` broker (work spread over the members, each message once; a
//! refused member closes the first; close sums the members' reports) are written once, in the
//! on-both `equivalence_consume.rs`.
//!
//! The queues are classic: a classic queue counts a consumer off as soon as its cancel is
//! answered, so `consumer_count` can be asserted right after a close; a quorum queue (RabbitMQ
//! 3.10) applies the cancel through its log and may report it a moment later, and ignores an
//! exclusive consume.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::{ConnectionOptions, ConsumerOptions, Error, Message, Outcome, QueueSpec};
use support::{amqp_url, connect_with, eventually, publish_n};

const WAIT: Duration = Duration::from_secs(30);

/// A connection allowed at most `channels` channels at once.
fn connect_allowing(channels: u16) -> acemq_amqp::Connection {
    connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .channel_max(channels),
    )
}

#[test]
fn a_group_whose_third_consumer_fails_to_start_closes_the_two_running_and_returns_the_error() {
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("group-third", QueueSpec::classic);
    let options = ConsumerOptions::new().prefetch(4).declare(false);
    let accept = |_: &Message| -> acemq_amqp::HandlerResult { Ok(Outcome::Accept) };
    // The fewest channels a connection needs to run a group of two (found by trying, on a fresh
    // connection each time, so nothing here assumes how many channels a member holds). On such
    // a connection members 1 and 2 start and member 3 finds no channel left: the broker-agreed
    // channel limit refuses exactly the third.
    let budget = (1..=32u16)
        .find(|&channels| {
            let limited = connect_allowing(channels);
            let started = ConsumerGroup::new(
                &limited,
                &q,
                ConsumerGroupOptions::new()
                    .members(2)
                    .consumer(options.clone()),
            )
            .and_then(|group| group.start(accept));
            let fits = started.map(|group| group.close().unwrap()).is_ok();
            limited.close().unwrap();
            fits
        })
        .expect("a group of two starts within 32 channels");

    publish_n(&conn, &q, 20, false);
    let limited = connect_allowing(budget);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let result = ConsumerGroup::new(
        &limited,
        &q,
        ConsumerGroupOptions::new().members(3).consumer(options),
    )
    .and_then(|group| {
        group.start(move |_: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
    });
    let error = result.expect_err("the third member has no channel to consume on");
    assert!(
        error.to_string().contains("no more channel ids"),
        "member 3's error comes back as it is: {error}"
    );
    // Members 1 and 2 were closed before the error came back: nobody holds the queue or its
    // messages, and the connection is still usable.
    let info = conn.queue_info(&q).unwrap();
    assert_eq!(info.consumer_count, 0, "members 1 and 2 were closed");
    assert_eq!(
        info.message_count as usize + handled.load(Ordering::SeqCst),
        20,
        "every message is either handled and acknowledged or back on the queue"
    );
    assert!(
        limited.is_connected(),
        "a refused channel does not cost the connection"
    );
    let group = ConsumerGroup::new(
        &limited,
        &q,
        ConsumerGroupOptions::new()
            .members(2)
            .consumer(ConsumerOptions::new().prefetch(4).declare(false)),
    )
    .and_then(|group| group.start(|_: &Message| Ok(Outcome::Accept)))
    .expect("the same connection still runs a group of two");
    support::wait_for_count(&conn, &q, 0, WAIT);
    group.close().unwrap();
    limited.close().unwrap();
}

#[test]
fn a_group_of_zero_is_refused_and_starts_nothing() {
    let (conn, _clean, q) = support::declared_queue("group-zero");
    let result = ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(0))
        .and_then(|group| group.start(|_: &Message| Ok(Outcome::Accept)));
    assert!(matches!(result, Err(Error::InvalidArgument { .. })));
    assert_eq!(conn.queue_info(&q).unwrap().consumer_count, 0);
}

#[test]
fn a_group_in_a_service_gives_back_its_running_handlers_at_the_drain_deadline() {
    use acemq_amqp::service::{Service, ServiceOptions};
    use std::sync::{Condvar, Mutex};
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("group-drain", QueueSpec::classic);
    // Each handler holds its message until released (at most a minute), far past the drain
    // deadline and short of the members' own 30 s shutdown timeout.
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let (g, s) = (gate.clone(), started.clone());
    let handler = move |_: &Message| -> acemq_amqp::HandlerResult {
        s.fetch_add(1, Ordering::SeqCst);
        let (open, cv) = &*g;
        let guard = open.lock().unwrap();
        let _unused = cv
            .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
            .unwrap();
        Ok(Outcome::Accept)
    };
    let queue = q.clone();
    let running = Service::new(
        ServiceOptions::new("group-drain", ConnectionOptions::new().address(amqp_url()))
            .signals(false),
    )
    .part("group", move |c| {
        let options = ConsumerGroupOptions::new()
            .members(2)
            .consumer(ConsumerOptions::new().prefetch(1).declare(false));
        let group = ConsumerGroup::new(c.consuming(), &queue, options)?.start(handler)?;
        Ok(Box::new(group) as Box<dyn acemq_amqp::service::ServicePart>)
    })
    .start()
    .unwrap();
    publish_n(&conn, &q, 2, false);
    assert!(
        eventually(WAIT, || started.load(Ordering::SeqCst) == 2),
        "both members are running a handler"
    );
    let draining = std::thread::spawn(move || running.drain_within(Duration::from_millis(500)));
    let drained = eventually(Duration::from_secs(10), || draining.is_finished());
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
    assert!(
        drained,
        "the group stopped at the service's drain deadline, not at its members' 30 s"
    );
    let report = draining.join().unwrap();
    assert_eq!(report.abandoned(), 2, "{report}");
    assert_eq!(report.exit_code(), 75, "{report}");
    // Given back: both are on the queue again for the next process.
    support::wait_for_count(&conn, &q, 2, WAIT);
}
