//! RabbitMQ streams on the real broker: reading from the first message, an offset, a moment and
//! the next message; park and reject copies; retry refused (never republished onto the stream);
//! a zero prefetch refused before anything is sent.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::streams::{
    declare_stream, stream_offset_of, Offset, RunningStreamReader, StreamOptions, StreamReader,
};
use acemq_amqp::StreamRetention;
use acemq_amqp::{Connection, Error, FatalError, Message, Outcome};
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

type Seen = Arc<Mutex<Vec<(u64, String)>>>;

/// A reader from `offset` recording (offset, body) of everything it accepts.
fn recorder(conn: &Connection, stream: &str, offset: Offset) -> (RunningStreamReader, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let reader = StreamReader::new(conn, stream, StreamOptions::new().offset(offset))
        .and_then(|reader| {
            reader.start(move |m: &Message| {
                let offset = stream_offset_of(m).expect("a stream delivery carries its offset");
                s.lock()
                    .unwrap()
                    .push((offset, String::from_utf8_lossy(&m.body).into_owned()));
                Ok(Outcome::Accept)
            })
        })
        .unwrap();
    (reader, seen)
}

fn publish(conn: &Connection, stream: &str, bodies: &[&str]) {
    let p = conn.publisher().unwrap();
    for b in bodies {
        p.publish("", stream, Message::new(*b)).unwrap();
    }
    p.close().unwrap();
}

fn bodies(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(_, b)| b.clone())
        .collect()
}

fn wait_for(seen: &Seen, n: usize) {
    assert!(
        eventually(WAIT, || seen.lock().unwrap().len() >= n),
        "read {:?}, wanted {n}",
        bodies(seen)
    );
}

#[test]
fn a_stream_is_read_from_first_from_an_offset_from_a_moment_and_from_next() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let s = clean.consumed_queue(&unique("stream-offsets"), &[]);
    let info = declare_stream(
        &conn,
        &s,
        StreamRetention::default()
            .max_age(Duration::from_secs(3600))
            .max_bytes(100_000_000),
    )
    .unwrap();
    assert_eq!(info.message_count, 0);
    publish(&conn, &s, &["a0", "a1", "a2", "a3"]);
    assert_eq!(
        conn.queue_info(&s).unwrap().message_count,
        0,
        "a stream reports depth 0 (documented)"
    );

    // From first: everything, in order, with increasing offsets.
    let (first, seen) = recorder(&conn, &s, Offset::First);
    wait_for(&seen, 4);
    first.close().unwrap();
    let all = seen.lock().unwrap().clone();
    assert_eq!(bodies(&seen), ["a0", "a1", "a2", "a3"]);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "{all:?}");

    // From an offset: the third message on.
    let (at, seen) = recorder(&conn, &s, Offset::At(all[2].0));
    wait_for(&seen, 2);
    at.close().unwrap();
    assert_eq!(bodies(&seen), ["a2", "a3"]);

    // From a moment: what was published at or after it (second precision: wait for the next
    // second to begin, so that the earlier messages are older).
    let moment = time::OffsetDateTime::now_utc() + time::Duration::seconds(1);
    assert!(eventually(Duration::from_secs(5), || {
        time::OffsetDateTime::now_utc().unix_timestamp() > moment.unix_timestamp()
    }));
    publish(&conn, &s, &["b0", "b1"]);
    let (since, seen) = recorder(&conn, &s, Offset::Since(moment));
    wait_for(&seen, 2);
    since.close().unwrap();
    assert_eq!(bodies(&seen), ["b0", "b1"]);

    // From next: only what is published after the reader subscribed.
    let (next, seen) = recorder(&conn, &s, Offset::Next);
    publish(&conn, &s, &["c0"]);
    wait_for(&seen, 1);
    // The handler records the message before it returns; the reader's position moves on once
    // the delivery is done with, a moment later.
    let after = seen.lock().unwrap()[0].0 + 1;
    assert!(
        eventually(WAIT, || next.position() == Some(after)),
        "position {:?}, expected {after}",
        next.position()
    );
    next.close().unwrap();
    assert_eq!(bodies(&seen), ["c0"]);
}

#[test]
fn park_and_reject_put_copies_aside_and_the_stream_keeps_the_originals() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let s = clean.consumed_queue(&unique("stream-park"), &[]);
    declare_stream(&conn, &s, StreamRetention::unbounded()).unwrap();
    publish(&conn, &s, &["park me", "reject me", "fatal", "fine"]);
    let reader = StreamReader::new(&conn, &s, StreamOptions::new().offset(Offset::First))
        .and_then(|reader| {
            reader.start(|m: &Message| match &m.body[..] {
                b"park me" => Ok(Outcome::park("look at it")),
                b"reject me" => Ok(Outcome::reject("bad")),
                b"fatal" => Err(Box::new(FatalError::new("unreadable")) as _),
                _ => Ok(Outcome::Accept),
            })
        })
        .unwrap();
    let (parked, dlq) = (
        acemq_amqp::parked_queue(&s),
        acemq_amqp::dead_letter_queue(&s),
    );
    let count = |q: &str| conn.queue_info(q).map(|i| i.message_count).unwrap_or(0);
    assert!(eventually(WAIT, || count(&parked) == 1 && count(&dlq) == 2));
    assert!(eventually(WAIT, || reader.position() == Some(4)));
    reader.close().unwrap();

    let raw = support::raw::Raw::open();
    let (props, _, body) = raw.get(&parked).unwrap();
    assert_eq!(body, b"park me");
    let error = format!(
        "{:?}",
        props.headers().as_ref().unwrap().get("x-acemq-error")
    );
    assert!(
        error.contains("the handler parked it: look at it"),
        "{error}"
    );
    raw.close();

    // Nothing was removed from the stream.
    let (again, seen) = recorder(&conn, &s, Offset::First);
    wait_for(&seen, 4);
    again.close().unwrap();
    assert_eq!(bodies(&seen), ["park me", "reject me", "fatal", "fine"]);
}

#[test]
fn a_retry_or_an_error_is_refused_parked_and_never_republished_onto_the_stream() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let s = clean.consumed_queue(&unique("stream-retry"), &[]);
    declare_stream(&conn, &s, StreamRetention::default()).unwrap();
    publish(&conn, &s, &["retry me", "fail me", "panic", "fine"]);
    let reader = StreamReader::new(&conn, &s, StreamOptions::new().offset(Offset::First))
        .and_then(|reader| {
            reader.start(|m: &Message| match &m.body[..] {
                b"retry me" => Ok(Outcome::retry("later")),
                b"fail me" => Err("database down".into()),
                b"panic" => panic!("boom"),
                _ => Ok(Outcome::Accept),
            })
        })
        .unwrap();
    let parked = acemq_amqp::parked_queue(&s);
    assert!(eventually(WAIT, || conn
        .queue_info(&parked)
        .map(|i| i.message_count == 3)
        .unwrap_or(false)));
    assert!(eventually(WAIT, || reader.position() == Some(4)));
    reader.close().unwrap();

    let raw = support::raw::Raw::open();
    let mut errors = Vec::new();
    while let Some((props, _, _)) = raw.get(&parked) {
        errors.push(format!(
            "{:?}",
            props.headers().as_ref().unwrap().get("x-acemq-error")
        ));
    }
    raw.close();
    assert_eq!(errors.len(), 3);
    for (e, reason) in errors
        .iter()
        .zip(["later", "Error: database down", "panic: boom"])
    {
        assert!(e.contains("refuses"), "{e}");
        assert!(
            e.contains("Outcome::park") && e.contains("Outcome::reject"),
            "{e}"
        );
        assert!(e.contains("x-stream-offset"), "{e}");
        assert!(e.contains(reason), "{e}");
    }
    let sample = Error::StreamRetry {
        stream: s.clone(),
        offset: Some(0),
        message_id: "m".into(),
        reason: "later".into(),
    };
    assert!(sample.to_string().contains(&format!("{s}.parked")));

    // No copy was appended to the stream: a sentinel published now comes right after the four.
    publish(&conn, &s, &["sentinel"]);
    let (again, seen) = recorder(&conn, &s, Offset::First);
    wait_for(&seen, 5);
    again.close().unwrap();
    assert_eq!(
        bodies(&seen),
        ["retry me", "fail me", "panic", "fine", "sentinel"]
    );
}

#[test]
fn a_zero_prefetch_is_refused_before_anything_is_sent() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let s = clean.consumed_queue(&unique("stream-prefetch"), &[]);
    declare_stream(&conn, &s, StreamRetention::default()).unwrap();
    let err = StreamReader::new(
        &conn,
        &s,
        StreamOptions::new().consumer(acemq_amqp::ConsumerOptions::new().prefetch(0)),
    )
    .and_then(|reader| reader.start(|_: &Message| Ok(Outcome::Accept)))
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("prefetch"), "{err}");
    assert_eq!(conn.queue_info(&s).unwrap().consumer_count, 0);
    assert!(
        matches!(
            conn.queue_info(&acemq_amqp::parked_queue(&s)),
            Err(Error::NotFound { .. })
        ),
        "nothing was declared either"
    );
}

#[test]
fn after_a_reconnect_a_reader_goes_on_where_it_was_not_from_its_first_offset() {
    let direct = connect();
    let mut clean = Cleanup::new(&direct);
    let s = clean.consumed_queue(&unique("stream-resume"), &[]);
    declare_stream(&direct, &s, StreamRetention::default()).unwrap();
    publish(&direct, &s, &["0", "1", "2", "3", "4"]);
    let (proxy, conn) = support::through_proxy(Duration::from_millis(200));
    let (reader, seen) = recorder(&conn, &s, Offset::First);
    wait_for(&seen, 5);
    assert!(eventually(WAIT, || reader.position() == Some(5)));
    proxy.cut();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    publish(&direct, &s, &["5", "6"]);
    wait_for(&seen, 7);
    reader.close().unwrap();
    // Not read from the first message again.
    assert_eq!(bodies(&seen), ["0", "1", "2", "3", "4", "5", "6"]);
}
