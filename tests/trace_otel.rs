//! The `opentelemetry` feature with an SDK installed (a recording tracer provider made here,
//! through the API crate's traits): the family's span names and kinds, the process span a child
//! of the incoming `traceparent`, the publish span its child, and the published message carrying
//! the publish span's context. Its own binary: the tracer provider is process-global.

#![cfg(feature = "opentelemetry")]

mod support;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use acemq_amqp::{headers, ConsumerOptions, Message, Outcome, QueueSpec};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use opentelemetry::trace::{
    Span, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer, TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use support::raw::Raw;
use support::{connect, eventually, unique, Cleanup};

#[derive(Clone, Debug)]
struct Ended {
    scope: String,
    name: String,
    kind: SpanKind,
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<SpanId>,
    attributes: Vec<KeyValue>,
    events: Vec<String>,
    error: bool,
}

impl Ended {
    fn attribute(&self, key: &str) -> Option<String> {
        self.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }
}

type Recorded = Arc<Mutex<Vec<Ended>>>;

#[derive(Clone)]
struct Provider(Recorded, Arc<AtomicU64>);

#[derive(Clone)]
struct RecordingTracer(Recorded, Arc<AtomicU64>, String);

struct RecordingSpan {
    context: SpanContext,
    record: Option<Ended>,
    sink: Recorded,
}

impl TracerProvider for Provider {
    type Tracer = RecordingTracer;
    fn tracer_with_scope(&self, scope: InstrumentationScope) -> RecordingTracer {
        RecordingTracer(self.0.clone(), self.1.clone(), scope.name().to_string())
    }
}

impl Tracer for RecordingTracer {
    type Span = RecordingSpan;
    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> RecordingSpan {
        let parent = parent_cx.span().span_context().clone();
        let trace_id = if parent.is_valid() {
            parent.trace_id()
        } else {
            TraceId::from(0x1234_u128 + u128::from(self.1.fetch_add(1, Ordering::SeqCst)))
        };
        let span_id = SpanId::from(0xabc0_u64 + self.1.fetch_add(1, Ordering::SeqCst));
        RecordingSpan {
            context: SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            record: Some(Ended {
                scope: self.2.clone(),
                name: builder.name.to_string(),
                kind: builder.span_kind.unwrap_or(SpanKind::Internal),
                trace_id,
                span_id,
                parent: parent.is_valid().then(|| parent.span_id()),
                attributes: builder.attributes.unwrap_or_default(),
                events: Vec::new(),
                error: false,
            }),
            sink: self.0.clone(),
        }
    }
}

impl Span for RecordingSpan {
    fn add_event_with_timestamp<T>(&mut self, name: T, _: SystemTime, _: Vec<KeyValue>)
    where
        T: Into<Cow<'static, str>>,
    {
        if let Some(r) = &mut self.record {
            r.events.push(name.into().into_owned());
        }
    }
    fn span_context(&self) -> &SpanContext {
        &self.context
    }
    fn is_recording(&self) -> bool {
        self.record.is_some()
    }
    fn set_attribute(&mut self, attribute: KeyValue) {
        if let Some(r) = &mut self.record {
            r.attributes.push(attribute);
        }
    }
    fn set_status(&mut self, status: Status) {
        if let Some(r) = &mut self.record {
            r.error = matches!(status, Status::Error { .. });
        }
    }
    fn update_name<T>(&mut self, _: T)
    where
        T: Into<Cow<'static, str>>,
    {
    }
    fn add_link(&mut self, _: SpanContext, _: Vec<KeyValue>) {}
    fn end_with_timestamp(&mut self, _: SystemTime) {
        if let Some(r) = self.record.take() {
            self.sink.lock().unwrap().push(r);
        }
    }
}

/// The spans of this process: one recording provider installed once (it is process-global);
/// each test finds its own spans by its queues' unique names.
fn recorded() -> Recorded {
    static RECORDED: std::sync::OnceLock<Recorded> = std::sync::OnceLock::new();
    RECORDED
        .get_or_init(|| {
            let recorded = Recorded::default();
            opentelemetry::global::set_tracer_provider(Provider(
                recorded.clone(),
                Arc::new(AtomicU64::new(1)),
            ));
            recorded
        })
        .clone()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[test]
fn spans_are_named_as_the_family_names_them_and_joined_across_the_hop() {
    let recorded = recorded();
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let input = clean.consumed_queue(&unique("otel-in"), &[]);
    let out = clean.consumed_queue(&unique("otel-out"), &[]);
    for q in [&input, &out] {
        conn.declare_queue(&QueueSpec::new(q).classic()).unwrap();
    }
    let publisher = conn.publisher().unwrap();
    let o = out.clone();
    let stepping = conn
        .consumer(&input, ConsumerOptions::new())
        .unwrap()
        .start(move |_: &Message| {
            publisher.publish("", &o, Message::new("next"))?;
            Ok(Outcome::Accept)
        })
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let collecting = conn
        .consumer(&out, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            g.lock().unwrap().push(m.clone());
            Ok(Outcome::Accept)
        })
        .unwrap();
    let raw = Raw::open();
    let mut table = FieldTable::new();
    table.insert(
        "traceparent".into(),
        AmqpValue::LongString(format!("00-{TRACE}-{PARENT}-01")),
    );
    raw.publish(
        "",
        &input,
        b"{}",
        AmqpProperties::default().with_headers(table),
    );
    raw.close();
    let process_of = |q: &str| format!("{q} process");
    assert!(eventually(Duration::from_secs(30), || {
        let r = recorded.lock().unwrap();
        r.iter().any(|s| s.name == process_of(&out))
            && r.iter().any(|s| s.name == process_of(&input))
    }));
    stepping.close().unwrap();
    collecting.close().unwrap();
    let spans = recorded.lock().unwrap().clone();
    let find = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name:?} in {spans:?}"))
            .clone()
    };
    let process = find(&process_of(&input));
    let publish = find(&format!("{out} publish"));
    let downstream = find(&process_of(&out));
    assert_eq!(process.scope, "org.acemq.amqp");
    assert_eq!(process.kind, SpanKind::Consumer);
    assert_eq!(process.trace_id.to_string(), TRACE);
    assert_eq!(
        process.parent.map(|p| p.to_string()).as_deref(),
        Some(PARENT)
    );
    assert_eq!(
        process.attribute("messaging.system").as_deref(),
        Some("rabbitmq")
    );
    assert_eq!(
        process.attribute("messaging.operation").as_deref(),
        Some("process")
    );
    assert_eq!(
        process.attribute("messaging.acemq.outcome").as_deref(),
        Some("acked")
    );
    assert_eq!(
        process.attribute("messaging.acemq.attempt").as_deref(),
        Some("1")
    );
    assert_eq!(publish.kind, SpanKind::Producer);
    assert_eq!(publish.trace_id.to_string(), TRACE);
    assert_eq!(publish.parent, Some(process.span_id));
    assert_eq!(
        publish.attribute("messaging.rabbitmq.destination.routing_key"),
        Some(out.clone())
    );
    assert_eq!(
        publish.attribute("messaging.acemq.outcome").as_deref(),
        Some("confirmed")
    );
    assert_eq!(downstream.parent, Some(publish.span_id));
    assert_eq!(downstream.trace_id.to_string(), TRACE);
    let message = got.lock().unwrap()[0].clone();
    assert_eq!(
        message
            .headers
            .get(headers::TRACEPARENT)
            .and_then(|v| v.as_str()),
        Some(format!("00-{TRACE}-{}-01", publish.span_id).as_str()),
        "the message carries the publish span"
    );
}

/// The outcome words of the family's process spans: a handler's own reject is `rejected` and
/// not an error; a message the consumer gives up on (no attempt left) is `dead_lettered`, an
/// error, with a `message.dead_lettered` event; a retry is `retried` with `message.retried`.
#[test]
fn a_handlers_reject_is_rejected_and_an_exhausted_retry_is_dead_lettered() {
    let recorded = recorded();
    let (conn, _clean, q) =
        support::declared_consumed_queue_with("otel-outcomes", QueueSpec::classic);
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .retry(acemq_amqp::RetryPolicy::fixed(2, Duration::from_millis(50)).jitter(0.0)),
        )
        .unwrap()
        .start(|m: &Message| {
            if m.body == b"reject" {
                return Err(Box::new(acemq_amqp::FatalError::new("not ours")) as _);
            }
            Ok(Outcome::retry("later"))
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("reject")).unwrap();
    publisher.publish("", &q, Message::new("retry")).unwrap();
    let name = format!("{q} process");
    let mine = || -> Vec<Ended> {
        let r = recorded.lock().unwrap();
        r.iter().filter(|s| s.name == name).cloned().collect()
    };
    assert!(eventually(Duration::from_secs(30), || mine().len() == 3));
    consumer.close().unwrap();
    let spans = mine();
    let with = |outcome: &str| -> Vec<Ended> {
        spans
            .iter()
            .filter(|s| s.attribute("messaging.acemq.outcome").as_deref() == Some(outcome))
            .cloned()
            .collect()
    };
    let (rejected, retried, dead) = (with("rejected"), with("retried"), with("dead_lettered"));
    assert_eq!(
        (rejected.len(), retried.len(), dead.len()),
        (1, 1, 1),
        "{spans:?}"
    );
    assert!(!rejected[0].error, "a deliberate reject is not an error");
    assert!(rejected[0].events.is_empty(), "{:?}", rejected[0].events);
    assert!(!retried[0].error, "a retry is not an error");
    assert_eq!(retried[0].events, ["message.retried"]);
    assert!(dead[0].error, "giving up on a message is");
    assert_eq!(dead[0].events, ["message.dead_lettered"]);
}
