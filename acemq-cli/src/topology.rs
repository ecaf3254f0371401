//! `acemq topology schedule|check`.

use std::time::Duration;

use acemq_amqp::patterns::scheduler::schedule_topology;
use acemq_amqp::{
    failure_topology, Binding, ExchangeKind, ExchangeSpec, HeaderValue, QueueKind, QueueSpec,
    TopologyDifference,
};
use serde_json::{json, Map, Value};

use crate::out::Out;
use crate::{connect, Failure, Outcome};

fn value(v: &HeaderValue) -> Value {
    match v {
        HeaderValue::Text(s) => json!(s),
        HeaderValue::Int(i) => json!(i),
        HeaderValue::Bool(b) => json!(b),
        HeaderValue::Float(f) => json!(f),
        other => json!(format!("{other:?}")),
    }
}

fn kind_of_exchange(k: &ExchangeKind) -> String {
    match k {
        ExchangeKind::Direct => "direct".into(),
        ExchangeKind::Fanout => "fanout".into(),
        ExchangeKind::Topic => "topic".into(),
        ExchangeKind::Headers => "headers".into(),
        ExchangeKind::Custom(s) => s.clone(),
    }
}

fn queue_json(q: &QueueSpec) -> Value {
    let kind = match q.kind() {
        QueueKind::Classic => "classic",
        QueueKind::Quorum => "quorum",
        QueueKind::Stream => "stream",
    };
    let (durable, exclusive, auto_delete) = q.flags();
    let args: Map<String, Value> = q
        .arguments()
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect();
    json!({ "queue": q.name(), "type": kind, "durable": durable, "exclusive": exclusive,
            "auto_delete": auto_delete, "arguments": args })
}

fn exchange_json(e: &ExchangeSpec) -> Value {
    json!({ "exchange": e.name(), "type": kind_of_exchange(e.kind()) })
}

fn binding_json(b: &Binding) -> Value {
    json!({ "binding": { "queue": b.queue, "exchange": b.exchange, "routing_key": b.routing_key } })
}

fn args_text(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "no arguments".into(),
    }
}

pub fn schedule(out: &mut Out) -> Outcome {
    let t = schedule_topology();
    let e = exchange_json(&t.exchange);
    out.record(e.clone());
    out.text(format!(
        "exchange {} ({}, durable)",
        t.exchange.name(),
        e["type"].as_str().unwrap_or("")
    ));
    for q in &t.queues {
        let j = queue_json(q);
        out.text(format!(
            "queue {} ({}, durable) {}",
            q.name(),
            j["type"].as_str().unwrap_or(""),
            args_text(&j["arguments"])
        ));
        out.record(j);
    }
    for b in &t.bindings {
        out.text(format!(
            "binding {} <- {} on {:?}",
            b.queue, b.exchange, b.routing_key
        ));
        out.record(binding_json(b));
    }
    Ok(0)
}

pub fn check(
    url: &str,
    queues: &[String],
    rungs: &[Duration],
    with_schedule: bool,
    out: &mut Out,
) -> Outcome {
    if queues.is_empty() && !with_schedule {
        return Err(Failure {
            code: 2,
            message: "topology check needs what to check: --queue Q (a consumed queue and its \
                      failure topology; repeatable) or --schedule (the scheduler's topology)"
                .into(),
        });
    }
    if !rungs.is_empty() && queues.is_empty() {
        return Err(Failure {
            code: 2,
            message: "--rung needs --queue (the rungs are a consumed queue's)".into(),
        });
    }
    let mut exchanges: Vec<ExchangeSpec> = Vec::new();
    let mut specs: Vec<QueueSpec> = Vec::new();
    let mut bindings: Vec<Binding> = Vec::new();
    let mut checking = Vec::new();
    if with_schedule {
        checking.push("the scheduler topology (acemq.schedule)".to_string());
        let t = schedule_topology();
        exchanges.push(t.exchange);
        specs.extend(t.queues);
        bindings.extend(t.bindings);
    }
    for q in queues {
        checking.push(format!("queue {q} and its failure topology"));
        let t = failure_topology(q, rungs);
        for e in t.exchanges {
            if !exchanges.iter().any(|x| x.name() == e.name()) {
                exchanges.push(e);
            }
        }
        specs.extend(t.queues);
        bindings.extend(t.bindings);
    }
    out.text(format!("checking {}", checking.join(", ")));
    let connection = connect(url)?;
    let result = compare(&connection, &exchanges, queues, &specs, out);
    let _ = connection.close();
    let differences = result?;
    let mut why = Vec::new();
    if with_schedule {
        why.push("see `acemq topology schedule`");
    }
    if !queues.is_empty() {
        why.push("a consumer binds its own when it starts");
    }
    out.text(format!(
        "{} binding(s) not checked: AMQP cannot list bindings ({})",
        bindings.len(),
        why.join("; ")
    ));
    out.record(json!({ "bindings_not_checked": bindings.len() }));
    let checked_queues = queues.len() + specs.len();
    out.text(format!(
        "{} exchange(s), {} queue(s) checked: {} difference(s)",
        exchanges.len(),
        checked_queues,
        differences
    ));
    out.record(
        json!({ "checked_exchanges": exchanges.len(), "checked_queues": checked_queues,
                       "differences": differences }),
    );
    Ok(if differences == 0 { 0 } else { 1 })
}

/// Consumed queue `q` itself: a consumer declares nothing for it (the application does), so
/// only its existence is checked; its messages and consumers are shown.
fn consumed_queue(
    connection: &acemq_amqp::Connection,
    q: &str,
) -> Result<Result<acemq_amqp::QueueInfo, TopologyDifference>, Failure> {
    match connection.queue_info(q) {
        Ok(info) => Ok(Ok(info)),
        Err(acemq_amqp::Error::NotFound { .. }) => Ok(Err(TopologyDifference {
            kind: "queue",
            name: q.to_string(),
            what: "existence".into(),
            expected: "present".into(),
            actual: "missing".into(),
        })),
        Err(e) => Err(Failure::from_error(&format!("checking queue {q}"), e)),
    }
}

fn compare(
    connection: &acemq_amqp::Connection,
    exchanges: &[ExchangeSpec],
    consumed: &[String],
    queues: &[QueueSpec],
    out: &mut Out,
) -> Result<usize, Failure> {
    let mut n = 0;
    for e in exchanges {
        let found = connection
            .compare_exchange(e)
            .map_err(|err| Failure::from_error(&format!("checking exchange {}", e.name()), err))?;
        report(found, "exchange", e.name(), &mut n, out);
    }
    for q in consumed {
        match consumed_queue(connection, q)? {
            Ok(info) => {
                out.text(format!(
                    "ok   queue {q} (present: {} message(s), {} consumer(s); its type and \
                     arguments are the application's, a consumer declares nothing for it)",
                    info.message_count, info.consumer_count
                ));
                out.record(json!({ "ok": { "kind": "queue", "name": q,
                                           "messages": info.message_count,
                                           "consumers": info.consumer_count } }));
            }
            Err(d) => report(vec![d], "queue", q, &mut n, out),
        }
    }
    for q in queues {
        let found = connection
            .compare_queue(q)
            .map_err(|err| Failure::from_error(&format!("checking queue {}", q.name()), err))?;
        report(found, "queue", q.name(), &mut n, out);
    }
    Ok(n)
}

/// `ok` when nothing was found, else each difference; counts them in `n`.
fn report(found: Vec<TopologyDifference>, kind: &str, name: &str, n: &mut usize, out: &Out) {
    if found.is_empty() {
        out.text(format!("ok   {kind} {name}"));
        out.record(json!({ "ok": { "kind": kind, "name": name } }));
    }
    for d in found {
        *n += 1;
        out.text(format!("DIFF {d}"));
        out.record(
            json!({ "difference": { "kind": d.kind, "name": d.name, "what": d.what,
                                           "expected": d.expected, "actual": d.actual } }),
        );
    }
}
