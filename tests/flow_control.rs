//! Flow control of a running consumer (issue 50, item 3), one body on both transports:
//! `pause` / `resume` (no deliveries taken while paused, running handlers finish, what was
//! prefetched goes back, nothing lost or handled twice), `scale_to` and `set_prefetch` (the new
//! concurrency and prefetch hold from then on), `drain` with its own deadline, and a close
//! while paused.

#[macro_use]
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::health::HealthReport;
use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome, RunningConsumer};
use support::{eventually, publish_n};

const WAIT: Duration = Duration::from_secs(30);

/// How many messages `q` holds now (`u32::MAX` when it cannot be asked).
fn depth(conn: &acemq_amqp::Connection, q: &str) -> u32 {
    conn.queue_info(q)
        .map(|i| i.message_count)
        .unwrap_or(u32::MAX)
}

/// Each id's handler runs, counted.
type Seen = Arc<Mutex<HashMap<String, u32>>>;

/// Counts a run of `m`'s handler.
fn count(seen: &Seen, m: &Message) {
    *seen.lock().unwrap().entry(m.id().to_string()).or_default() += 1;
}

/// How many ids' handlers ran.
fn total(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

/// Blocks the handler until `open` is set (or a generous deadline passes, so a broken test
/// ends), counting the handlers waiting now in `waiting`.
fn wait_gate(open: &AtomicBool, waiting: &AtomicUsize) {
    waiting.fetch_add(1, Ordering::SeqCst);
    let end = Instant::now() + WAIT;
    while !open.load(Ordering::SeqCst) && Instant::now() < end {
        std::thread::park_timeout(Duration::from_millis(5));
    }
    waiting.fetch_sub(1, Ordering::SeqCst);
}

/// A consumer of `q` with `options` whose handler waits at a gate (see [`wait_gate`]), then
/// runs `then` and accepts; the gate's flag, the count of handlers waiting, and the consumer.
fn gated(
    conn: &Connection,
    q: &str,
    options: ConsumerOptions,
    then: impl Fn(&Message) + Send + Sync + 'static,
) -> (Arc<AtomicBool>, Arc<AtomicUsize>, RunningConsumer) {
    let open = Arc::new(AtomicBool::new(false));
    let waiting = Arc::new(AtomicUsize::new(0));
    let (o, w) = (open.clone(), waiting.clone());
    let consumer = conn
        .consumer(q, options)
        .unwrap()
        .start(move |m: &Message| {
            wait_gate(&o, &w);
            then(m);
            Ok(Outcome::Accept)
        })
        .unwrap();
    (open, waiting, consumer)
}

/// The health report of the connection's (one) consumer.
fn consumer_health(conn: &Connection) -> HealthReport {
    conn.health()
        .components
        .iter()
        .find(|(name, _)| name.starts_with("consumer:"))
        .map(|(_, r)| r.clone())
        .expect("the consumer's health")
}

/// Waits (up to `WAIT`) until `q` is empty and nothing is in flight in `consumer`.
fn wait_until_all_settled(conn: &Connection, q: &str, consumer: &RunningConsumer) {
    assert!(
        eventually(WAIT, || depth(conn, q) == 0 && consumer.in_flight() == 0),
        "{} on {q}, {} in flight",
        depth(conn, q),
        consumer.in_flight()
    );
}

on_both! {
    /// A paused consumer takes nothing (what is published meanwhile stays on the queue), its
    /// health says paused, and after `resume` every message is handled exactly once.
    fn a_paused_consumer_takes_nothing_until_resumed(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-pause");
        let seen: Seen = Default::default();
        let s = seen.clone();
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().prefetch(10).concurrency(2))
            .unwrap()
            .start(move |m: &Message| {
                count(&s, m);
                Ok(Outcome::Accept)
            })
            .unwrap();
        let mut ids = publish_n(&conn, &q, 10, true);
        assert!(eventually(WAIT, || total(&seen) == 10 && consumer.in_flight() == 0));
        let report = consumer.pause().unwrap();
        assert_eq!(report.abandoned, 0);
        assert!(consumer.is_paused());
        let part = consumer_health(&conn);
        assert_eq!(part.parts["paused"], serde_json::json!(true), "{part:?}");
        ids.extend(publish_n(&conn, &q, 20, true));
        // Published and confirmed while paused: all still on the queue, none handled.
        assert_eq!(depth(&conn, &q), 20);
        assert_eq!(total(&seen), 10);
        assert_eq!(consumer.pause().unwrap(), Default::default(), "pausing twice does nothing");
        consumer.resume().unwrap();
        assert!(!consumer.is_paused());
        assert!(eventually(WAIT, || total(&seen) == 30 && consumer.in_flight() == 0));
        consumer.resume().unwrap();
        let report = consumer.close().unwrap();
        assert_eq!(report.handled, 30);
        let seen = seen.lock().unwrap();
        assert!(ids.iter().all(|id| seen.get(id) == Some(&1)), "each once: {seen:?}");
        assert_eq!(depth(&conn, &q), 0);
    }

    /// `pause` waits for the handler that is running (it finishes and is settled) and gives
    /// back what was prefetched and not started; after `resume` those run, once each.
    fn a_pause_lets_the_running_handler_finish_and_gives_back_the_prefetched(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-pause-busy");
        let seen: Seen = Default::default();
        let s = seen.clone();
        let ids = publish_n(&conn, &q, 5, true);
        let options = ConsumerOptions::new().prefetch(5).concurrency(1);
        let (open, waiting, consumer) = gated(&conn, &q, options, move |m| count(&s, m));
        assert!(eventually(WAIT, || waiting.load(Ordering::SeqCst) == 1));
        std::thread::scope(|scope| {
            let pausing = scope.spawn(|| consumer.pause().unwrap());
            // The pause waits for the running handler: open its gate once the consumer has
            // stopped taking deliveries (nothing more is handed to the worker).
            assert!(eventually(WAIT, || consumer.in_flight() <= 1));
            open.store(true, Ordering::SeqCst);
            let report = pausing.join().unwrap();
            assert_eq!(report.finished_in_time, 1, "{report:?}");
            assert_eq!(report.abandoned, 0, "{report:?}");
        });
        assert_eq!(total(&seen), 1, "only the running one was handled");
        assert!(eventually(WAIT, || depth(&conn, &q) == 4), "the rest went back");
        consumer.resume().unwrap();
        assert!(eventually(WAIT, || total(&seen) == 5 && consumer.in_flight() == 0));
        consumer.close().unwrap();
        let seen = seen.lock().unwrap();
        assert!(ids.iter().all(|id| seen.get(id) == Some(&1)), "each once: {seen:?}");
    }

    /// `scale_to(4)` on a consumer of one worker: four handlers run at once from then on,
    /// and its health says so.
    fn scale_to_changes_how_many_handlers_run_at_once(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-scale");
        let options = ConsumerOptions::new().prefetch(8).concurrency(1);
        let (open, waiting, consumer) = gated(&conn, &q, options, |_| {});
        consumer.scale_to(4).unwrap();
        publish_n(&conn, &q, 8, true);
        assert!(
            eventually(WAIT, || waiting.load(Ordering::SeqCst) == 4),
            "four handlers at once: {}",
            waiting.load(Ordering::SeqCst)
        );
        let part = consumer_health(&conn);
        assert_eq!(part.parts["concurrency"], serde_json::json!(4));
        open.store(true, Ordering::SeqCst);
        wait_until_all_settled(&conn, &q, &consumer);
        assert_eq!(consumer.close().unwrap().handled, 8);
        assert!(conn.consumer(&q, ConsumerOptions::new()).is_ok());
    }

    /// `set_prefetch(3)`: with one handler blocked, the broker sends no more than three
    /// ahead; back to 10, it sends ten.
    fn set_prefetch_bounds_what_the_broker_sends_ahead(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-prefetch");
        let options = ConsumerOptions::new().prefetch(10).concurrency(1);
        let (open, _, consumer) = gated(&conn, &q, options, |_| {});
        consumer.set_prefetch(3).unwrap();
        publish_n(&conn, &q, 20, true);
        assert!(eventually(WAIT, || consumer.in_flight() == 3 && depth(&conn, &q) == 17));
        assert!(consumer.set_prefetch(0).is_err(), "0 is refused");
        assert!(consumer.scale_to(0).is_err(), "0 is refused");
        // Changing it ends the subscription: the blocked handler must finish first.
        std::thread::scope(|scope| {
            let changing = scope.spawn(|| consumer.set_prefetch(10));
            open.store(true, Ordering::SeqCst);
            changing.join().unwrap().unwrap();
        });
        wait_until_all_settled(&conn, &q, &consumer);
        assert_eq!(consumer.close().unwrap().handled, 20);
    }

    /// `drain` with a deadline shorter than the handler: the handler is abandoned, its
    /// message given back to the queue, and `drain` returns at its deadline.
    fn drain_gives_back_a_handler_still_running_at_its_deadline(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-drain");
        let options = ConsumerOptions::new()
            .prefetch(1)
            .shutdown_timeout(Duration::from_secs(60));
        let (open, waiting, consumer) = gated(&conn, &q, options, |_| {});
        publish_n(&conn, &q, 1, true);
        assert!(eventually(WAIT, || waiting.load(Ordering::SeqCst) == 1));
        let began = Instant::now();
        let report = consumer.drain(Duration::from_millis(300)).unwrap();
        assert!(began.elapsed() < Duration::from_secs(20), "not the options' 60 s");
        assert_eq!(report.abandoned, 1, "{report:?}");
        open.store(true, Ordering::SeqCst);
        assert!(eventually(WAIT, || depth(&conn, &q) == 1), "given back");
    }

    /// A paused consumer closes at once, and a closed one refuses flow control.
    fn a_paused_consumer_closes_and_a_closed_one_refuses_control(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("flow-closed");
        let consumer = conn
            .consumer(&q, ConsumerOptions::new())
            .unwrap()
            .start(|_: &Message| Ok(Outcome::Accept))
            .unwrap();
        publish_n(&conn, &q, 3, true);
        wait_until_all_settled(&conn, &q, &consumer);
        consumer.pause().unwrap();
        let stop = consumer.stop_handle();
        stop.stop();
        assert!(eventually(WAIT, || consumer.is_finished()), "a stop ends a paused consumer");
        assert!(matches!(consumer.resume(), Err(acemq_amqp::Error::Closed { .. })));
        assert_eq!(consumer.close().unwrap().handled, 3);
    }
}
