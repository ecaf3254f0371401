//! The control consumer's work: a message out of a rung hops down the ladder or is delivered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::options::SchedulerOptions;
use super::topology::{next_rung, SCHEDULED_MESSAGE_TYPE};
use crate::connection::Connection;
use crate::consume::{HandlerResult, Outcome};
use crate::envelope::{headers, HeaderValue, Message};
use crate::error::FatalError;
use crate::error::{Error, Result};
use crate::publish::Publisher;

/// The content type a delivery gets when none was recorded.
const DEFAULT_CONTENT_TYPE: &str = "application/json";
/// How long a control message waits before another try when its hop or delivery failed.
const FAILED_HOP_PAUSE: Duration = Duration::from_secs(2);
/// Where a due message that reached no queue waits before it is tried again.
const KEEP_WAIT: Duration = Duration::from_secs(10);

/// What the scheduler's threads share.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) options: SchedulerOptions,
    pub(super) publisher: Publisher,
    /// Its "now" (`Connection::now_ms`: the broker's clock on `memory://`).
    pub(super) connection: Connection,
    pub(super) scheduled: AtomicU64,
    pub(super) delivered: AtomicU64,
    pub(super) hops: AtomicU64,
    pub(super) rejected: AtomicU64,
}

/// A scheduled message as it travels: body, the four headers and the application's headers.
pub(super) struct Scheduled {
    pub(super) id: String,
    pub(super) body: Vec<u8>,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    pub(super) due_ms: i64,
    /// The application's headers, the four scheduler headers among them as received.
    pub(super) headers: std::collections::BTreeMap<String, HeaderValue>,
    /// The header table as received, so that unchanged headers keep their AMQP types.
    pub(super) received: Option<Arc<crate::transport::FieldTable>>,
}

/// Removes the four scheduler headers and the broker's dead-letter bookkeeping.
pub(super) fn strip_scheduler_headers(h: &mut std::collections::BTreeMap<String, HeaderValue>) {
    h.retain(|k, _| {
        !(k == headers::SCHEDULE_EXCHANGE
            || k == headers::SCHEDULE_ROUTING_KEY
            || k == headers::SCHEDULE_DUE_AT
            || k == headers::SCHEDULE_CONTENT_TYPE
            || is_broker_header(k))
    });
}

fn is_broker_header(name: &str) -> bool {
    name == "x-delivery-count"
        || name.starts_with("x-death")
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// Text from a header written as a string or bytes.
fn text(v: Option<&HeaderValue>) -> Option<String> {
    match v? {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

/// An integer written in any width or as decimal text.
fn integer(v: Option<&HeaderValue>) -> Option<i64> {
    match v? {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        HeaderValue::Float(f) if f.is_finite() => Some(*f as i64),
        HeaderValue::Timestamp(t) => i64::try_from(*t).ok()?.checked_mul(1000),
        _ => None,
    }
}

impl Inner {
    /// A control message: a scheduled message out of a rung (or put straight on the control
    /// queue by another scheduler).
    pub(super) fn on_control(&self, m: &Message) -> HandlerResult {
        let exchange = text(m.headers.get(headers::SCHEDULE_EXCHANGE));
        let routing_key = text(m.headers.get(headers::SCHEDULE_ROUTING_KEY));
        let due = integer(m.headers.get(headers::SCHEDULE_DUE_AT));
        let (Some(exchange), Some(routing_key), Some(due_ms)) = (exchange, routing_key, due) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            let why = FatalError::new(format!(
                "message {} on {:?} is not a scheduled message (it lacks {}, {} or a readable \
                 {}): something other than a scheduler publishes to the scheduler's queues; it \
                 is dropped",
                m.id(),
                self.options.control_queue(),
                headers::SCHEDULE_EXCHANGE,
                headers::SCHEDULE_ROUTING_KEY,
                headers::SCHEDULE_DUE_AT
            ));
            log::error!("acemq: scheduler: {why}");
            return Ok(Outcome::Accept);
        };
        let scheduled = Scheduled {
            id: m.id().to_string(),
            body: m.body.clone(),
            exchange,
            routing_key,
            due_ms,
            headers: m.headers.clone(),
            received: m
                .properties
                .as_ref()
                .and_then(|p| p.headers().clone())
                .map(Arc::new),
        };
        match self.route(scheduled) {
            Ok(()) => Ok(Outcome::Accept),
            Err(e) => {
                log::warn!(
                    "acemq: scheduler: could not move message {} on ({e}); it is tried again \
                     in {FAILED_HOP_PAUSE:?}",
                    m.id()
                );
                Ok(Outcome::in_progress(FAILED_HOP_PAUSE))
            }
        }
    }

    /// Puts the message on its next rung, or delivers it when due.
    pub(super) fn route(&self, s: Scheduled) -> Result<()> {
        let remaining =
            u64::try_from(s.due_ms.saturating_sub(self.connection.now_ms())).unwrap_or(0);
        match next_rung(&self.options.rungs, Duration::from_millis(remaining)) {
            Some(rung) => self.hop(s, rung),
            None => self.deliver(s),
        }
    }

    fn hop(&self, s: Scheduled, rung: Duration) -> Result<()> {
        let queue = self.options.rung_queue(rung);
        let mut m = Message::new(s.body)
            .with_id(s.id)
            .with_type(SCHEDULED_MESSAGE_TYPE)
            .with_content_type("application/octet-stream");
        m.headers = s.headers;
        m.headers.retain(|k, _| !is_broker_header(k));
        m.received_headers = s.received;
        self.publisher.publish(&self.options.base, &queue, m)?;
        self.hops.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn deliver(&self, s: Scheduled) -> Result<()> {
        let content_type = text(s.headers.get(headers::SCHEDULE_CONTENT_TYPE))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_string());
        let mut application = s.headers.clone();
        strip_scheduler_headers(&mut application);
        // A copy of the body: kept (on a rung) when no queue receives the delivery.
        let mut m = Message::new(s.body.clone())
            .with_id(s.id.clone())
            .with_type(SCHEDULED_MESSAGE_TYPE)
            .with_content_type(content_type);
        m.headers = application;
        m.received_headers = s.received.clone();
        match self.publisher.publish(&s.exchange, &s.routing_key, m) {
            Ok(()) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(Error::Unroutable { .. }) => self.keep(s),
            Err(e) => Err(e),
        }
    }

    /// A due message no queue received: back on the rung nearest 10 s, to be tried again.
    fn keep(&self, s: Scheduled) -> Result<()> {
        let rung = self
            .options
            .rungs
            .iter()
            .copied()
            .min_by_key(|r| r.abs_diff(KEEP_WAIT))
            .unwrap_or(KEEP_WAIT);
        log::warn!(
            "acemq: scheduler: message {} is due but no queue receives it on exchange {:?} \
             with routing key {:?}; it is kept on {:?} and tried again",
            s.id,
            s.exchange,
            s.routing_key,
            self.options.rung_queue(rung)
        );
        self.hop(s, rung)
    }
}
