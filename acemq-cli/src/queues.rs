//! `acemq replay` and `acemq peek`.

use std::sync::{Arc, Mutex};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::ReplayEvent;
use acemq_amqp::patterns::claim_check::claim_key_of;
use acemq_amqp::patterns::replay::Stopped;
use acemq_amqp::patterns::routing_slip::slip_from;
use acemq_amqp::{headers, HeaderValue, Message};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::out::{age, age_of_ms, rfc3339_ms, Out};
use crate::{connect, Failure, Outcome, PeekArgs, ReplayArgs};

/// The queue a replay reads: a `.dlq` / `.parked` as given, a work queue's `.dlq` otherwise.
fn source_queue(queue: &str) -> String {
    if queue.ends_with(".dlq") || queue.ends_with(".parked") {
        queue.to_string()
    } else {
        acemq_amqp::dead_letter_queue(queue)
    }
}

/// What a dry run lists for one message.
struct Listed {
    id: String,
    message_type: Option<String>,
    attempt: u32,
    error: Option<String>,
    first_seen_ms: i64,
}

/// Feeds the progress bar from the replay's progress events.
struct Progress(ProgressBar);

impl Observer for Progress {
    fn replay(&self, e: &ReplayEvent<'_>) {
        let r = e.report;
        self.0
            .set_position(r.moved + r.skipped + (r.matched - r.moved));
        self.0
            .set_message(format!("moved {}, skipped {}", r.moved, r.skipped));
    }
}

pub fn replay(url: &str, a: &ReplayArgs, out: &mut Out) -> Outcome {
    let source = source_queue(&a.queue);
    let connection = connect(url)?;
    let result = run_replay(&connection, &source, a, out);
    let _ = connection.close();
    result
}

fn run_replay(
    connection: &acemq_amqp::Connection,
    source: &str,
    a: &ReplayArgs,
    out: &mut Out,
) -> Outcome {
    let waiting = connection
        .queue_info(source)
        .map_err(|e| Failure::from_error(&format!("cannot replay {source:?}"), e))?
        .message_count;
    let total = match (a.limit, &a.error_contains) {
        (Some(l), None) => l.min(u64::from(waiting)),
        _ => u64::from(waiting),
    };
    let bar = if out.json() {
        ProgressBar::hidden()
    } else {
        // Drawn only when stderr is a terminal.
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {bar:30} {pos}/{len} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let listed: Arc<Mutex<Vec<Listed>>> = Arc::new(Mutex::new(Vec::new()));
    let record = listed.clone();
    let dry_run = a.dry_run;
    let needle = a.error_contains.clone();
    let mut options = acemq_amqp::patterns::replay::ReplayOptions::default()
        .restart(!a.no_restart)
        .dry_run(a.dry_run)
        .progress_every(1)
        .observer(Progress(bar.clone()))
        .only_message(move |m: &Message| {
            let wanted = match &needle {
                Some(n) => m.failure_reason().is_some_and(|e| e.contains(n.as_str())),
                None => true,
            };
            if wanted && dry_run {
                if let Ok(mut l) = record.lock() {
                    l.push(Listed {
                        id: m.envelope.id.clone(),
                        message_type: m.envelope.message_type.clone(),
                        attempt: m.envelope.attempt,
                        error: m.failure_reason(),
                        first_seen_ms: m.envelope.first_seen_ms,
                    });
                }
            }
            wanted
        });
    if let Some(l) = a.limit {
        options = options.limit(l);
    }
    if let Some(d) = a.deadline {
        options = options.deadline(d);
    }
    if let Some(k) = &a.to_routing_key {
        options = options.routing_key(k.clone());
    }
    if let Some(e) = &a.to_exchange {
        options = options.exchange(e.clone());
    }
    let result = acemq_amqp::patterns::replay::replay(connection, source, options).run();
    bar.finish_and_clear();
    // The deadline as it was read (`--deadline 5` is five seconds), in the summary.
    let deadline_ms = a
        .deadline
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let deadline_text = a
        .deadline
        .map_or(String::new(), |d| format!("; deadline {}", age(d)));
    if a.dry_run {
        let listed = listed.lock().map(|mut l| std::mem::take(&mut *l));
        for m in listed.unwrap_or_default() {
            let age_d = age_of_ms(m.first_seen_ms);
            out.text(format!(
                "would move {}  type={}  attempt={}  age={}  error={}",
                m.id,
                m.message_type.as_deref().unwrap_or("-"),
                m.attempt,
                age(age_d),
                m.error.as_deref().unwrap_or("-")
            ));
            out.record(json!({
                "would_move": m.id,
                "type": m.message_type,
                "attempt": m.attempt,
                "error": m.error,
                "first_seen": rfc3339_ms(m.first_seen_ms),
                "age_ms": u64::try_from(age_d.as_millis()).unwrap_or(u64::MAX),
            }));
        }
    }
    match result {
        Ok(report) => {
            let summary = json!({
                "queue": report.queue,
                "dry_run": report.dry_run,
                "moved": report.moved,
                "would_move": if report.dry_run { report.matched } else { 0 },
                "skipped": report.skipped,
                "stopped": report.stopped.as_str(),
                "deadline_ms": deadline_ms,
                "elapsed_ms": u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
            });
            out.text(format!("{}: {report}{deadline_text}", report.queue));
            out.record(summary);
            // Stopped by the deadline or the window: messages were left behind.
            Ok(match report.stopped {
                Stopped::Drained | Stopped::Limit => 0,
                _ => 1,
            })
        }
        Err(acemq_amqp::Error::Replay { report, source }) => {
            out.record(json!({
                "queue": report.queue,
                "dry_run": report.dry_run,
                "moved": report.moved,
                "skipped": report.skipped,
                "stopped": report.stopped.as_str(),
                "deadline_ms": deadline_ms,
                "error": source.to_string(),
            }));
            let failure = Failure::from_error(
                &format!("replay of {:?} stopped after {report}", report.queue),
                *source,
            );
            Err(failure)
        }
        Err(e) => Err(Failure::from_error(&format!("cannot replay {source:?}"), e)),
    }
}

pub fn peek(url: &str, a: &PeekArgs, out: &mut Out) -> Outcome {
    let connection = connect(url)?;
    let result = if a.unordered {
        acemq_amqp::patterns::peek::peek_unordered(&connection, &a.queue, a.limit)
    } else {
        acemq_amqp::patterns::peek::peek(&connection, &a.queue, a.limit)
    };
    let _ = connection.close();
    let messages = result.map_err(|e| {
        let e = match e {
            // The library names its function; the CLI names its flag.
            acemq_amqp::Error::InvalidArgument { reason } => acemq_amqp::Error::InvalidArgument {
                reason: reason.replace("peek_unordered reads", "acemq peek --unordered reads"),
            },
            other => other,
        };
        Failure::from_error(&format!("cannot peek at {:?}", a.queue), e)
    })?;
    if messages.is_empty() {
        out.text(format!("{}: empty", a.queue));
    }
    for (i, m) in messages.iter().enumerate() {
        let view = describe(m);
        out.record(json!({ "position": i + 1, "queue": a.queue, "message": view }));
        out.text(human(i + 1, &view));
    }
    Ok(0)
}

/// The envelope of one message, as peek shows it.
fn describe(m: &Message) -> Value {
    let e = &m.envelope;
    let text = |name: &str| m.headers.get(name).and_then(as_text);
    let replay = json!({
        "from": text(headers::REPLAYED_FROM),
        "at": text(headers::REPLAYED_AT),
        "count": m.headers.get(headers::REPLAY_COUNT).and_then(as_int),
    });
    let slip = match slip_from(m) {
        Ok(Some(slip)) => json!({
            "done": slip.done().len(),
            "remaining": slip.remaining().len(),
            "next": slip.next().map(|s| format!("{}/{}", s.exchange, s.routing_key)),
        }),
        Ok(None) => Value::Null,
        Err(e) => json!({ "unreadable": e.to_string() }),
    };
    let age_d = age_of_ms(e.first_seen_ms);
    json!({
        "id": e.id,
        "type": e.message_type,
        "attempt": e.attempt,
        "error": m.failure_reason(),
        "first_seen": rfc3339_ms(e.first_seen_ms),
        "age_ms": u64::try_from(age_d.as_millis()).unwrap_or(u64::MAX),
        "correlation": e.correlation_id,
        "replayed": if replay["from"].is_null() && replay["count"].is_null() { Value::Null } else { replay },
        "slip": slip,
        "claim_check": claim_key_of(&m.body),
        "claim": e.claim,
        "routing_key": m.received.as_ref().map(|r| r.routing_key.clone()),
        "exchange": m.received.as_ref().map(|r| r.exchange.clone()),
        "content_type": m.content_type,
        "bytes": m.body.len(),
    })
}

fn human(position: usize, v: &Value) -> String {
    let s = |k: &str| match &v[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut line = format!(
        "#{position} {}  type={}  attempt={}  first-seen={} ({} ago)  error={}",
        s("id"),
        s("type"),
        s("attempt"),
        s("first_seen"),
        age(std::time::Duration::from_millis(
            v["age_ms"].as_u64().unwrap_or(0)
        )),
        s("error"),
    );
    if let Value::Object(r) = &v["replayed"] {
        line.push_str(&format!(
            "  replayed={}x from {} at {}",
            r.get("count").and_then(Value::as_i64).unwrap_or(0),
            r.get("from").and_then(Value::as_str).unwrap_or("-"),
            r.get("at").and_then(Value::as_str).unwrap_or("-"),
        ));
    }
    if let Value::Object(slip) = &v["slip"] {
        match slip.get("unreadable") {
            Some(e) => line.push_str(&format!("  slip=unreadable ({e})")),
            None => line.push_str(&format!(
                "  slip={}/{} next={}",
                slip.get("done").and_then(Value::as_u64).unwrap_or(0),
                slip.get("done").and_then(Value::as_u64).unwrap_or(0)
                    + slip.get("remaining").and_then(Value::as_u64).unwrap_or(0),
                slip.get("next")
                    .and_then(Value::as_str)
                    .unwrap_or("(finished)"),
            )),
        }
    }
    if let Some(k) = v["claim_check"].as_str() {
        line.push_str(&format!("  claim-check={k}"));
    }
    line
}

fn as_text(v: &HeaderValue) -> Option<String> {
    match v {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        HeaderValue::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn as_int(v: &HeaderValue) -> Option<i64> {
    match v {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        _ => None,
    }
}
