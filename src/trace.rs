//! W3C trace context: a trace started in any AceMQ service continues through this one.
//!
//! # What travels, and what is promised
//!
//! The family carries trace context in the two W3C headers, **unprefixed**:
//! [`traceparent`](crate::headers::TRACEPARENT) (`00-<32 hex trace id>-<16 hex parent id>-<2 hex
//! flags>`) and [`tracestate`](crate::headers::TRACESTATE) (Python `tracing.py`: "Java, Go and
//! .NET write the same two names"; deliberately not `x-acemq-`, so tooling that knows nothing
//! of AceMQ reads them). They are application headers: a received message keeps them.
//!
//! While a consumer's handler runs (and while the consumer publishes the retry, dead-letter or
//! parked copy of that message), the message's trace context is **current on the handler's
//! thread** ([`TraceContext::current`]). Every message published then through this crate —
//! [`Publisher`](crate::Publisher) (so a handler's own publishes, [`then`](crate::patterns::pipeline::then)
//! pipeline steps, [`follow_slip`](crate::patterns::routing_slip::follow_slip) hops, replies of
//! [`Responder`](crate::patterns::request_reply::Responder), the scheduler's hops and deliveries),
//! [`Requester`](crate::patterns::request_reply::Requester) requests, and outbox records made with
//! [`record`](crate::patterns::outbox::record) / [`record_message`](crate::patterns::outbox::record_message)
//! (the relay later publishes the stored headers) — gets the current context's `traceparent`
//! and `tracestate` **unless it carries a `traceparent` of its own** (an application's choice
//! wins, and a copy keeps its original's as written). Retry, dead-letter and parked copies and
//! replayed messages are copies: they carry the original's headers unchanged.
//!
//! [`with_timeout`](crate::patterns::chain::with_timeout) runs the handler on a thread of its own; the
//! context goes with it. A thread of the application's own does not inherit it: take
//! [`TraceContext::current`] and [`enter`](TraceContext::enter) it there.
//!
//! An incoming `traceparent` that is not valid W3C (wrong length, not lower-case hex, an
//! all-zero id, version `ff`) is not continued (W3C: the receiver restarts the trace); the
//! header itself stays on the message and its copies as it arrived.
//!
//! # Without the `opentelemetry` feature
//!
//! The headers are carried through **unchanged**: what is published because of a message
//! carries that message's `traceparent` and `tracestate` exactly.
//!
//! # With the `opentelemetry` feature
//!
//! Built on the `opentelemetry` API crate only (its `trace` part): inert until the application
//! installs an SDK (`opentelemetry::global::set_tracer_provider`); with the API's no-op
//! provider the headers are carried unchanged, as without the feature. With an SDK, spans are
//! recorded under the instrumentation scope `org.acemq.amqp` (the family's) and named as the
//! family names them (Python `tracing.py`, Java's instrumentation):
//!
//! | span | kind | when |
//! |---|---|---|
//! | `<queue> process` | CONSUMER | a handler runs (child of the message's `traceparent`), until the consumer settled it |
//! | `<destination> publish` | PRODUCER | a message goes out (`destination` = exchange, or the routing key on the default exchange); its context is what the message carries |
//! | `<destination> request` | CLIENT | a [`Requester`](crate::patterns::request_reply::Requester) waits for a reply; outcome `answered` or `timed_out` |
//!
//! Attributes (the family's): `messaging.system` = `rabbitmq`, `messaging.destination.name`,
//! `messaging.operation`, `messaging.message.id`, `messaging.message.conversation_id` (the
//! correlation id), `messaging.rabbitmq.destination.routing_key` (publish only),
//! `messaging.acemq.message_type`, `messaging.acemq.attempt` (process), and
//! `messaging.acemq.outcome`: `acked`, `retried`, `dead_lettered`, `parked` (process),
//! `confirmed`, `failed`, `unroutable` (publish, when its ticket is waited on), `answered`,
//! `timed_out` (request). `dead_lettered`, `failed` and `unroutable` set the error status (the
//! family's `ERROR_OUTCOMES`). The W3C headers are read and written here (they are a fixed
//! format); the application's global propagator is not consulted.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::envelope::{headers, HeaderValue, Message};

thread_local! {
    static CURRENT: RefCell<Option<TraceContext>> = const { RefCell::new(None) };
}

/// A W3C trace context: a valid `traceparent` and the `tracestate` that came with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from a `traceparent` (and a `tracestate`), or `None` when the `traceparent`
    /// is not valid W3C trace context (version `00`: exactly `00-<32 hex>-<16 hex>-<2 hex>`,
    /// lower case, ids not all zero; a later version: at least that, its first four fields in
    /// that shape; never version `ff`). An empty `tracestate` counts as none.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let tp = traceparent.trim();
        if !valid_traceparent(tp) {
            return None;
        }
        Some(TraceContext {
            traceparent: tp.to_string(),
            tracestate: tracestate
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// The context a message carries (its `traceparent` and `tracestate` headers, as text or
    /// UTF-8 bytes), or `None`.
    pub fn of(message: &Message) -> Option<TraceContext> {
        let text = |name: &str| match message.headers.get(name)? {
            HeaderValue::Text(s) => Some(s.clone()),
            HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        };
        let traceparent = text(headers::TRACEPARENT)?;
        TraceContext::parse(&traceparent, text(headers::TRACESTATE).as_deref())
    }

    /// The context current on this thread: the consumed message's while its handler runs, or
    /// one [entered](Self::enter) by the application.
    pub fn current() -> Option<TraceContext> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Makes this context current on this thread until the returned scope is dropped (the
    /// previous one is current again then).
    pub fn enter(self) -> TraceScope {
        let previous = CURRENT.with(|c| c.borrow_mut().replace(self));
        TraceScope {
            previous,
            _not_send: PhantomData,
        }
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lower-case hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The parent (span) id: 16 lower-case hex digits.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// True when the sampled flag is set.
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }

    /// Writes this context on a message: `traceparent`, and `tracestate` when there is one
    /// (a `tracestate` the message had is removed when this context has none).
    pub fn apply_to(&self, message: &mut Message) {
        message.headers.insert(
            headers::TRACEPARENT.to_string(),
            HeaderValue::Text(self.traceparent.clone()),
        );
        match &self.tracestate {
            Some(ts) => {
                message.headers.insert(
                    headers::TRACESTATE.to_string(),
                    HeaderValue::Text(ts.clone()),
                );
            }
            None => {
                message.headers.remove(headers::TRACESTATE);
            }
        }
    }
}

/// The scope of an [entered](TraceContext::enter) context; restores the previous one when
/// dropped. Not `Send`: it belongs to the thread that entered it.
#[must_use = "the context is current only while the scope lives"]
#[derive(Debug)]
pub struct TraceScope {
    previous: Option<TraceContext>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for TraceScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn valid_traceparent(tp: &str) -> bool {
    if tp.len() < 55 || !tp.is_ascii() {
        return false;
    }
    let (version, trace_id, parent_id, flags) = (&tp[0..2], &tp[3..35], &tp[36..52], &tp[53..55]);
    let dashes = [2, 35, 52].iter().all(|&i| tp.as_bytes()[i] == b'-');
    let shape = dashes
        && is_hex(version)
        && is_hex(trace_id)
        && is_hex(parent_id)
        && is_hex(flags)
        && version != "ff"
        && trace_id.bytes().any(|b| b != b'0')
        && parent_id.bytes().any(|b| b != b'0');
    if !shape {
        return false;
    }
    if version == "00" {
        tp.len() == 55
    } else {
        // A later version may append fields after a dash.
        tp.len() == 55 || tp.as_bytes()[55] == b'-'
    }
}

/// Gives a message about to be published the current trace context, unless it has a
/// `traceparent` of its own. With the `opentelemetry` feature, starts the `publish` span whose
/// context the message then carries.
pub(crate) fn stamp(message: &mut Message, exchange: &str, routing_key: &str) -> PublishSpan {
    if message.headers.contains_key(headers::TRACEPARENT) {
        return PublishSpan::none();
    }
    #[cfg(feature = "opentelemetry")]
    {
        if let Some((span, context)) = otel::publish_span(message, exchange, routing_key) {
            context.apply_to(message);
            return span;
        }
    }
    let _ = (exchange, routing_key);
    if let Some(current) = TraceContext::current() {
        current.apply_to(message);
    }
    PublishSpan::none()
}

/// The trace of a consumed message while it is handled: its context current on the thread, and
/// (with the `opentelemetry` feature) its `process` span.
pub(crate) struct Consuming {
    _scope: Option<TraceScope>,
    #[cfg(feature = "opentelemetry")]
    span: Option<otel::ProcessSpan>,
}

impl Consuming {
    pub(crate) fn start(message: &Message, queue: &str) -> Consuming {
        #[cfg(feature = "opentelemetry")]
        {
            let (span, context) = otel::process_span(message, queue);
            Consuming {
                _scope: context.map(TraceContext::enter),
                span,
            }
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            let _ = queue;
            Consuming {
                _scope: TraceContext::of(message).map(TraceContext::enter),
            }
        }
    }

    /// Ends the span with the consumer's outcome (`accept`, `retry`, `reject`, `park`, …, as
    /// the observer's labels).
    pub(crate) fn settled(self, decision: crate::observe::Decision) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.span {
            span.end(decision.family_word());
        }
        let _ = decision;
    }
}

/// A publish's span (with the `opentelemetry` feature), ended when its ticket is answered.
#[derive(Debug, Default)]
pub(crate) struct PublishSpan {
    #[cfg(feature = "opentelemetry")]
    span: Option<otel::Span>,
}

impl PublishSpan {
    pub(crate) fn none() -> PublishSpan {
        PublishSpan::default()
    }

    /// Ends it with the publish's result.
    pub(crate) fn end(&mut self, result: Result<(), &crate::Error>) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.span.take() {
            otel::end_publish(span, result);
        }
        let _ = result;
    }
}

/// A request's span (with the `opentelemetry` feature): current while the request is sent, so
/// the request's `publish` span is its child.
pub(crate) struct RequestSpan {
    #[cfg(feature = "opentelemetry")]
    span: Option<otel::ProcessSpan>,
}

impl RequestSpan {
    pub(crate) fn start(exchange: &str, routing_key: &str) -> RequestSpan {
        let _ = (exchange, routing_key);
        RequestSpan {
            #[cfg(feature = "opentelemetry")]
            span: otel::request_span(exchange, routing_key),
        }
    }

    /// Ends it: `answered`, `timed_out` or `failed`.
    pub(crate) fn end(self, outcome: &str) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.span {
            span.end(outcome);
        }
        let _ = outcome;
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
        TraceState, Tracer as _,
    };
    use opentelemetry::{global, Context, KeyValue};

    use super::{PublishSpan, TraceContext};
    use crate::envelope::Message;

    pub(super) type Span = global::BoxedSpan;

    /// The instrumentation scope the whole family records under.
    const SCOPE: &str = "org.acemq.amqp";
    const SYSTEM: &str = "rabbitmq";

    /// Starts the span of `operation` on `destination` (named `"{destination} {operation}"`, as
    /// the family names them) under `parent`, with the family's three messaging attributes and
    /// `more`.
    fn start(
        destination: &str,
        operation: &'static str,
        kind: SpanKind,
        more: impl IntoIterator<Item = KeyValue>,
        parent: &Context,
    ) -> Span {
        let tracer = global::tracer(SCOPE);
        let attributes = [
            KeyValue::new("messaging.system", SYSTEM),
            KeyValue::new("messaging.destination.name", destination.to_string()),
            KeyValue::new("messaging.operation", operation),
        ];
        tracer
            .span_builder(format!("{destination} {operation}"))
            .with_kind(kind)
            .with_attributes(attributes.into_iter().chain(more))
            .start_with_context(&tracer, parent)
    }

    fn span_context(tc: &TraceContext) -> Option<SpanContext> {
        let trace_id = TraceId::from_hex(tc.trace_id()).ok()?;
        let span_id = SpanId::from_hex(tc.parent_id()).ok()?;
        let flags = if tc.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let state = tc
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(SpanContext::new(trace_id, span_id, flags, true, state))
    }

    fn to_trace_context(sc: &SpanContext) -> Option<TraceContext> {
        if !sc.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{:032x}-{:016x}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags() & TraceFlags::SAMPLED
        );
        let state = sc.trace_state().header();
        TraceContext::parse(&traceparent, Some(&state))
    }

    /// The parent for what is published now: the application's current OpenTelemetry span if
    /// it has one, else the consumed message's context.
    fn parent() -> Context {
        let current = Context::current();
        if current.span().span_context().is_valid() {
            return current;
        }
        match TraceContext::current().as_ref().and_then(span_context) {
            Some(sc) => current.with_remote_span_context(sc),
            None => current,
        }
    }

    fn error_outcome(outcome: &str) -> bool {
        matches!(outcome, "unroutable" | "failed" | "dead_lettered")
    }

    fn set_outcome(span: &mut Span, outcome: &str) {
        span.set_attribute(KeyValue::new(
            "messaging.acemq.outcome",
            outcome.to_string(),
        ));
        if error_outcome(outcome) {
            span.set_status(Status::error(outcome.to_string()));
        }
    }

    pub(super) fn publish_span(
        message: &Message,
        exchange: &str,
        routing_key: &str,
    ) -> Option<(PublishSpan, TraceContext)> {
        let parent = parent();
        let destination = if exchange.is_empty() {
            routing_key
        } else {
            exchange
        };
        let e = &message.envelope;
        let span = start(
            destination,
            "publish",
            SpanKind::Producer,
            [
                KeyValue::new("messaging.message.id", e.id.clone()),
                KeyValue::new(
                    "messaging.message.conversation_id",
                    e.correlation_id.clone().unwrap_or_else(|| e.id.clone()),
                ),
                KeyValue::new(
                    "messaging.rabbitmq.destination.routing_key",
                    routing_key.to_string(),
                ),
                KeyValue::new(
                    "messaging.acemq.message_type",
                    e.message_type.clone().unwrap_or_default(),
                ),
            ],
            &parent,
        );
        let context = to_trace_context(span.span_context())?;
        Some((PublishSpan { span: Some(span) }, context))
    }

    pub(super) fn end_publish(mut span: Span, result: Result<(), &crate::Error>) {
        let outcome = match result {
            Ok(()) => "confirmed",
            Err(crate::Error::Unroutable { .. }) => "unroutable",
            Err(_) => "failed",
        };
        set_outcome(&mut span, outcome);
        span.end();
    }

    pub(super) struct ProcessSpan(Span, Option<opentelemetry::ContextGuard>);

    impl ProcessSpan {
        /// Ends the span with the family's outcome word (`Decision::family_word`: `rejected`
        /// the handler's own decision, `dead_lettered` the consumer's).
        pub(super) fn end(self, outcome: &str) {
            let ProcessSpan(mut span, guard) = self;
            drop(guard);
            // Events on the delivery's own span at the moment the consumer decides, as the
            // family records them.
            match outcome {
                "retried" => span.add_event("message.retried", Vec::new()),
                "dead_lettered" => span.add_event("message.dead_lettered", Vec::new()),
                _ => {}
            }
            set_outcome(&mut span, outcome);
            span.end();
        }
    }

    pub(super) fn process_span(
        message: &Message,
        queue: &str,
    ) -> (Option<ProcessSpan>, Option<TraceContext>) {
        let incoming = TraceContext::of(message);
        let parent = match incoming.as_ref().and_then(span_context) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let e = &message.envelope;
        let span = start(
            queue,
            "process",
            SpanKind::Consumer,
            [
                KeyValue::new("messaging.message.id", e.id.clone()),
                KeyValue::new(
                    "messaging.message.conversation_id",
                    e.correlation_id.clone().unwrap_or_else(|| e.id.clone()),
                ),
                KeyValue::new(
                    "messaging.acemq.message_type",
                    e.message_type.clone().unwrap_or_default(),
                ),
                KeyValue::new("messaging.acemq.attempt", i64::from(e.attempt)),
            ],
            &parent,
        );
        // The context current while the handler runs: the span's when it is a real one, else
        // (no SDK) the message's own, carried unchanged; the message's tracestate goes on when
        // the span has none of its own.
        let context = to_trace_context(span.span_context())
            .or_else(|| incoming.clone())
            .map(|mut c| {
                if c.tracestate.is_none() {
                    c.tracestate = incoming.as_ref().and_then(|m| m.tracestate.clone());
                }
                c
            });
        // The application's own spans in the handler are children of the process span.
        let attached = attach(&span);
        (Some(ProcessSpan(span, attached)), context)
    }

    pub(super) fn request_span(exchange: &str, routing_key: &str) -> Option<ProcessSpan> {
        let parent = parent();
        let destination = if exchange.is_empty() {
            routing_key
        } else {
            exchange
        };
        let span = start(destination, "request", SpanKind::Client, [], &parent);
        let attached = attach(&span);
        Some(ProcessSpan(span, attached))
    }

    /// Makes a real span current for the application's and this crate's child spans.
    fn attach(span: &Span) -> Option<opentelemetry::ContextGuard> {
        span.span_context().is_valid().then(|| {
            Context::current()
                .with_remote_span_context(span.span_context().clone())
                .attach()
        })
    }
}
