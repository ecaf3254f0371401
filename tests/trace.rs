//! W3C trace context on the real broker: a trace set on an incoming message (by a foreign
//! client) appears on everything published because of it, across four hops, and a message
//! published outside any handler carries none.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::chain::{chain, with_timeout};
use acemq_amqp::patterns::outbox::{record, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions};
use acemq_amqp::patterns::pipeline::{then, Next};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::trace::TraceContext;
use acemq_amqp::{
    dead_letter_queue, headers, BoxError, ConsumerOptions, HeaderValue, Message, Outcome, QueueSpec,
};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use serde_json::json;
use support::raw::Raw;
use support::{collect, connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

fn text(m: &Message, name: &str) -> Option<String> {
    m.headers
        .get(name)
        .and_then(|v| v.as_str().map(str::to_string))
}

#[track_caller]
fn assert_traced(what: &str, m: &Message) {
    assert_eq!(
        text(m, headers::TRACEPARENT).as_deref(),
        Some(TRACEPARENT),
        "{what}: traceparent"
    );
    assert_eq!(
        text(m, headers::TRACESTATE).as_deref(),
        Some(TRACESTATE),
        "{what}: tracestate"
    );
}

/// Publishes like a foreign library would: raw AMQP with the two W3C headers.
fn publish_traced(queue: &str, body: &[u8]) {
    publish_traced_with(queue, body, FieldTable::new());
}

/// [`publish_traced`] with other headers too.
fn publish_traced_with(queue: &str, body: &[u8], mut table: FieldTable) {
    let raw = Raw::open();
    table.insert(
        "traceparent".into(),
        AmqpValue::LongString(TRACEPARENT.into()),
    );
    table.insert(
        "tracestate".into(),
        AmqpValue::LongString(TRACESTATE.into()),
    );
    raw.publish(
        "",
        queue,
        body,
        AmqpProperties::default()
            .with_headers(table)
            .with_content_type("application/json".into()),
    );
    raw.close();
}

/// in --then--> mid --(request to rr, reply)--> --(outbox record, relayed)--> out; mid's own
/// message rejected to its `.dlq`. Every one of them carries the incoming trace.
#[test]
fn a_trace_on_an_incoming_message_reaches_everything_published_because_of_it() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let input = clean.consumed_queue(&unique("trace-in"), &[]);
    let mid = clean.consumed_queue(&unique("trace-mid"), &[]);
    let rr = clean.consumed_queue(&unique("trace-rr"), &[]);
    let out = clean.consumed_queue(&unique("trace-out"), &[]);
    for q in [&input, &mid, &rr, &out] {
        conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    }
    // Hop 1: a pipeline step.
    let step = then(conn.publisher().unwrap(), "", mid.clone(), |m: &Message| {
        let v: serde_json::Value = m.payload()?;
        Ok(Next::Publish(json!({ "step": 1, "was": v })))
    });
    let stepping = conn.consume(&input, step).unwrap();
    // Hop 3: the responder (its reply).
    let requests = Arc::new(Mutex::new(Vec::new()));
    let r = requests.clone();
    let responder = Responder::new(&conn, &rr, ResponderOptions::new())
        .and_then(|responder| {
            responder.start(move |m: &Message| {
                r.lock().unwrap().push(m.clone());
                Ok::<_, BoxError>(Message::new("pong"))
            })
        })
        .unwrap();
    // Hop 2: a handler that asks (request), records an outbox record, then rejects its message.
    let requester = Arc::new(
        Requester::new(&conn, RequesterOptions::new().routing_key(&rr))
            .and_then(Requester::start)
            .unwrap(),
    );
    let replies = Arc::new(Mutex::new(Vec::new()));
    let records = Arc::new(Mutex::new(Vec::new()));
    let (rq, rp, rc, out_q) = (
        requester.clone(),
        replies.clone(),
        records.clone(),
        out.clone(),
    );
    let middle = conn
        .consumer(&mid, ConsumerOptions::new())
        .unwrap()
        .start(move |_: &Message| {
            let reply = rq.ask(Message::new("ping"))?;
            rp.lock().unwrap().push(reply);
            rc.lock().unwrap().push(record(
                &acemq_amqp::JsonCodec,
                "",
                &out_q,
                &json!({"step": 4}),
            )?);
            Ok(Outcome::reject("enough"))
        })
        .unwrap();
    let (collecting, got) = collect(&conn, &out);

    publish_traced(&input, br#"{"order":"o-1"}"#);

    let dlq = dead_letter_queue(&mid);
    support::wait_for_count(&conn, &dlq, 1, WAIT);
    // Hop 4: the relay publishes the record on a thread of its own, later.
    let store = InMemoryOutboxStore::new();
    for rec in records.lock().unwrap().iter() {
        store.add(rec).unwrap();
    }
    let relay = OutboxRelay::new(&conn, store, OutboxRelayOptions::new()).unwrap();
    assert_eq!(relay.sweep().unwrap(), 1);
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 1));
    stepping.close().unwrap();
    middle.close().unwrap();
    responder.close().unwrap();
    collecting.close().unwrap();

    assert_eq!(requests.lock().unwrap().len(), 1);
    assert_traced("the request", &requests.lock().unwrap()[0]);
    assert_traced("the reply", &replies.lock().unwrap()[0]);
    assert_traced("the relayed record", &got.lock().unwrap()[0]);
    let raw = Raw::open();
    let (props, _, _) = raw.get(&dlq).expect("the dead-letter copy");
    raw.close();
    let h = props.headers().clone().unwrap();
    assert_eq!(
        h.get("traceparent"),
        Some(&AmqpValue::LongString(TRACEPARENT.into())),
        "the dead-letter copy"
    );
    assert_eq!(
        h.get("tracestate"),
        Some(&AmqpValue::LongString(TRACESTATE.into()))
    );
}

/// A handler's own publish carries its message's trace; one published outside a handler
/// carries none; a traceparent the application set is kept; `with_timeout` carries it to the
/// handler's own thread.
#[test]
fn a_handler_publishes_in_its_messages_trace_and_nothing_else_gets_one() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let input = clean.consumed_queue(&unique("trace-handler"), &[]);
    let out = clean.consumed_queue(&unique("trace-handler-out"), &[]);
    for q in [&input, &out] {
        conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    }
    let publisher = conn.publisher().unwrap();
    let p = publisher.clone();
    let o = out.clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = move |m: &Message| {
        s.lock().unwrap().push(TraceContext::current());
        p.publish("", &o, Message::new("derived"))?;
        // An application's own choice of trace wins.
        p.publish(
            "",
            &o,
            Message::new("own").with_header(
                headers::TRACEPARENT,
                "00-11111111111111111111111111111111-2222222222222222-00",
            ),
        )?;
        let _ = m;
        Ok(Outcome::Accept)
    };
    let handler = chain(handler, [with_timeout(Duration::from_secs(20)).unwrap()]);
    let consuming = conn.consume(&input, handler).unwrap();
    let (collecting, got) = collect(&conn, &out);
    publish_traced(&input, b"{}");
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 2));
    assert!(TraceContext::current().is_none());
    publisher
        .publish("", &out, Message::new("untraced"))
        .unwrap();
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 3));
    consuming.close().unwrap();
    collecting.close().unwrap();
    let got = got.lock().unwrap();
    let by_body = |b: &[u8]| got.iter().find(|m| m.body == b).unwrap().clone();
    assert_traced("the handler's publish", &by_body(b"derived"));
    assert_eq!(
        text(&by_body(b"own"), headers::TRACEPARENT).as_deref(),
        Some("00-11111111111111111111111111111111-2222222222222222-00")
    );
    assert!(!by_body(b"own").headers.contains_key(headers::TRACESTATE));
    assert!(!by_body(b"untraced")
        .headers
        .contains_key(headers::TRACEPARENT));
    let seen = seen.lock().unwrap();
    let current = seen[0].clone().expect("current in the handler");
    assert_eq!(current.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(current.tracestate(), Some(TRACESTATE));
}

#[test]
fn traceparent_is_parsed_as_w3c_says() {
    let ok = TraceContext::parse(TRACEPARENT, Some("")).unwrap();
    assert_eq!(ok.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(ok.parent_id(), "00f067aa0ba902b7");
    assert!(ok.sampled());
    assert_eq!(ok.tracestate(), None);
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        assert!(TraceContext::parse(bad, None).is_none(), "{bad:?}");
    }
    // A later version may carry more fields.
    assert!(TraceContext::parse(
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-ab",
        None
    )
    .is_some());
    // Read from a message, as text or bytes; entered and left.
    let m = Message::new("x").with_header(
        headers::TRACEPARENT,
        HeaderValue::Bytes(TRACEPARENT.as_bytes().to_vec()),
    );
    let tc = TraceContext::of(&m).unwrap();
    {
        let _scope = tc.clone().enter();
        assert_eq!(TraceContext::current(), Some(tc));
    }
    assert_eq!(TraceContext::current(), None);
}

/// Retry copies — one held in the consumer and published back to the queue by the timer
/// thread, one waiting on a broker rung — and a routing slip's hop keep the trace of the message
/// they copy or carry on.
#[test]
fn retry_copies_and_a_slip_hop_keep_the_trace() {
    use acemq_amqp::patterns::routing_slip::{follow_slip, FollowSlipOptions, RoutingSlip};
    use acemq_amqp::RetryPolicy;
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let rung = Duration::from_millis(100);
    let retried = clean.consumed_queue(&unique("trace-retry"), &[rung]);
    let stop_a = clean.consumed_queue(&unique("trace-slip-a"), &[]);
    let stop_b = clean.consumed_queue(&unique("trace-slip-b"), &[]);
    for q in [&retried, &stop_a, &stop_b] {
        conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    }
    // Attempt 1 waits 50 ms in the consumer (the timer publishes the copy), attempt 2 waits
    // 100 ms on the broker rung (the worker publishes it), attempt 3 accepts.
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a = attempts.clone();
    let retrying = conn
        .consumer(
            &retried,
            ConsumerOptions::new().retry(
                RetryPolicy::exponential()
                    .max_attempts(3)
                    .initial_delay(Duration::from_millis(50))
                    .max_delay(Duration::from_secs(1))
                    .jitter(0.0)
                    .broker_wait_threshold(Duration::from_millis(80)),
            ),
        )
        .unwrap()
        .start(move |m: &Message| {
            a.lock()
                .unwrap()
                .push((m.envelope.attempt, text(m, headers::TRACEPARENT)));
            if m.envelope.attempt < 3 {
                return Ok(Outcome::retry("not yet"));
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    publish_traced(&retried, b"{}");
    assert!(eventually(WAIT, || attempts.lock().unwrap().len() == 3));
    retrying.close().unwrap();
    for (attempt, traceparent) in attempts.lock().unwrap().iter() {
        assert_eq!(
            traceparent.as_deref(),
            Some(TRACEPARENT),
            "attempt {attempt} arrived in the incoming trace"
        );
    }

    // A slip written by another library: stop A, then stop B.
    let slip = RoutingSlip::new()
        .then("", &stop_a, "a")
        .then("", &stop_b, "b");
    let mut table = FieldTable::new();
    table.insert(
        headers::ROUTING_SLIP.into(),
        AmqpValue::LongString(slip.to_json()),
    );
    let publisher = conn.publisher().unwrap();
    let following = conn
        .consume(
            &stop_a,
            follow_slip(
                &publisher,
                |m: &Message| Ok(Some(Message::new(m.body.clone()))),
                FollowSlipOptions::new(),
            ),
        )
        .unwrap();
    let (collecting, got) = collect(&conn, &stop_b);
    publish_traced_with(&stop_a, b"{}", table);
    assert!(eventually(WAIT, || got.lock().unwrap().len() == 1));
    following.close().unwrap();
    collecting.close().unwrap();
    assert_traced("the slip's hop", &got.lock().unwrap()[0]);
}
