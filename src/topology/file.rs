//! A [`Topology`] read from a file (TOML with the `toml` feature, or JSON): the format
//! `docs/topology.md` describes. Unknown keys are refused, naming them, so a typo is not a
//! queue declared without its arguments.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::model::Topology;
use crate::connection::{Binding, ExchangeKind, ExchangeSpec, QueueSpec, StreamRetention};
use crate::consume::RetryPolicy;
use crate::envelope::HeaderValue;
use crate::error::{Error, Result};
use crate::patterns::scheduler::SchedulerOptions;
use crate::settings::parse::duration;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    exchanges: Vec<ExchangeEntry>,
    #[serde(default)]
    queues: Vec<QueueEntry>,
    #[serde(default)]
    bindings: Vec<BindingEntry>,
    scheduler: Option<SchedulerEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeEntry {
    name: String,
    #[serde(rename = "type", default = "direct")]
    kind: String,
    durable: Option<bool>,
    auto_delete: Option<bool>,
    internal: Option<bool>,
    #[serde(default)]
    arguments: BTreeMap<String, serde_json::Value>,
}

fn direct() -> String {
    "direct".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueEntry {
    name: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    durable: Option<bool>,
    message_ttl: Option<String>,
    max_length: Option<i64>,
    dead_letter_exchange: Option<String>,
    dead_letter_routing_key: Option<String>,
    /// A stream's retention.
    max_age: Option<String>,
    max_bytes: Option<u64>,
    #[serde(default)]
    arguments: BTreeMap<String, serde_json::Value>,
    /// A consumed queue: its `.dlq` and `.parked` beside it.
    #[serde(default)]
    dead_letter: bool,
    /// A consumed queue with this retry policy: its rungs too.
    retry: Option<RetryEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryEntry {
    #[serde(default = "exponential")]
    kind: String,
    max_attempts: Option<u32>,
    initial_delay: Option<String>,
    max_delay: Option<String>,
    broker_wait_threshold: Option<String>,
    quorum_rungs: Option<bool>,
}

fn exponential() -> String {
    "exponential".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingEntry {
    exchange: String,
    queue: String,
    #[serde(default)]
    routing_key: String,
    #[serde(default)]
    arguments: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerEntry {
    base: Option<String>,
    rungs: Option<Vec<String>>,
}

fn value(key: &str, v: serde_json::Value) -> Result<HeaderValue> {
    Ok(match v {
        serde_json::Value::Bool(b) => HeaderValue::Bool(b),
        serde_json::Value::String(s) => HeaderValue::Text(s),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => HeaderValue::Int(i),
            None => HeaderValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        other => {
            return Err(Error::invalid(format!(
                "argument {key}: {other} is not a number, a string or a boolean"
            )))
        }
    })
}

fn exchange_of(e: ExchangeEntry) -> Result<ExchangeSpec> {
    let kind = match e.kind.as_str() {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_string()),
    };
    let mut spec = ExchangeSpec::new(e.name, kind);
    if let Some(d) = e.durable {
        spec = spec.durable(d);
    }
    if let Some(a) = e.auto_delete {
        spec = spec.auto_delete(a);
    }
    if let Some(i) = e.internal {
        spec = spec.internal(i);
    }
    for (k, v) in e.arguments {
        let v = value(&k, v)?;
        spec = spec.argument(k, v);
    }
    Ok(spec)
}

fn retry_of(queue: &str, r: RetryEntry) -> Result<RetryPolicy> {
    let label = |k: &str| format!("queues[{queue}].retry.{k}");
    let wait = |k: &str, v: &Option<String>| -> Result<Option<Duration>> {
        v.as_deref().map(|t| duration(&label(k), t)).transpose()
    };
    let mut policy = match r.kind.as_str() {
        "exponential" => RetryPolicy::exponential(),
        "fixed" => RetryPolicy::fixed(3, Duration::from_secs(1)),
        "none" => RetryPolicy::none(),
        other => {
            return Err(Error::invalid(format!(
                "{}: `{other}` is not a retry kind: exponential, fixed or none",
                label("kind")
            )))
        }
    };
    if let Some(n) = r.max_attempts {
        policy = policy.max_attempts(n);
    }
    if let Some(d) = wait("initial_delay", &r.initial_delay)? {
        policy = policy.initial_delay(d);
    }
    if let Some(d) = wait("max_delay", &r.max_delay)? {
        policy = policy.max_delay(d);
    }
    if let Some(d) = wait("broker_wait_threshold", &r.broker_wait_threshold)? {
        policy = policy.broker_wait_threshold(d);
    }
    if let Some(q) = r.quorum_rungs {
        policy = policy.quorum_rungs(q);
    }
    Ok(policy)
}

fn queue_of(q: QueueEntry) -> Result<(QueueSpec, Option<RetryPolicy>)> {
    let label = |k: &str| format!("queues[{}].{k}", q.name);
    let mut spec = match q.kind.as_deref() {
        None | Some("quorum") => QueueSpec::new(q.name.clone()),
        Some("classic") => QueueSpec::new(q.name.clone()).classic(),
        Some("stream") => {
            let mut retention = StreamRetention::unbounded();
            if let Some(age) = &q.max_age {
                retention = retention.max_age(duration(&label("max_age"), age)?);
            }
            if let Some(bytes) = q.max_bytes {
                retention = retention.max_bytes(bytes);
            }
            QueueSpec::stream(q.name.clone(), retention)
        }
        Some(other) => {
            return Err(Error::invalid(format!(
                "{}: `{other}` is not a queue type: quorum, classic or stream",
                label("type")
            )))
        }
    };
    if let Some(d) = q.durable {
        spec = spec.durable(d);
    }
    if let Some(ttl) = &q.message_ttl {
        spec = spec.message_ttl(duration(&label("message_ttl"), ttl)?);
    }
    if let Some(max) = q.max_length {
        spec = spec.max_length(max);
    }
    if let Some(x) = q.dead_letter_exchange.clone() {
        spec = spec.dead_letter_exchange(x);
    }
    if let Some(k) = q.dead_letter_routing_key.clone() {
        spec = spec.dead_letter_routing_key(k);
    }
    for (k, v) in q.arguments {
        let v = value(&k, v)?;
        spec = spec.argument(k, v);
    }
    let policy = match q.retry {
        Some(r) => Some(retry_of(&q.name, r)?),
        None => q.dead_letter.then(RetryPolicy::none),
    };
    Ok((spec, policy))
}

fn topology_of(file: File) -> Result<Topology> {
    let mut t = Topology::new();
    for e in file.exchanges {
        t = t.exchange(exchange_of(e)?);
    }
    for q in file.queues {
        t = match queue_of(q)? {
            (spec, Some(policy)) => t.consumed_queue(spec, &policy),
            (spec, None) => t.queue(spec),
        };
    }
    for b in file.bindings {
        let mut binding = Binding::new()
            .exchange(b.exchange)
            .queue(b.queue)
            .routing_key(b.routing_key);
        for (k, v) in b.arguments {
            let v = value(&k, v)?;
            binding = binding.argument(k, v);
        }
        t = t.binding(binding);
    }
    if let Some(s) = file.scheduler {
        let mut options = SchedulerOptions::new();
        if let Some(base) = s.base {
            options = options.base(base);
        }
        if let Some(rungs) = s.rungs {
            let rungs = rungs
                .iter()
                .map(|r| duration("scheduler.rungs", r))
                .collect::<Result<Vec<_>>>()?;
            options = options.rungs(rungs);
        }
        t = t.scheduler(&options);
    }
    Ok(t)
}

impl Topology {
    /// A topology from JSON (`docs/topology.md`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming what is wrong: an unknown key, a bad value (with the
    /// item and the key), or JSON that does not parse (with its line and column).
    pub fn from_json_str(text: &str) -> Result<Topology> {
        let file: File = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("the topology (JSON): {e}")))?;
        topology_of(file)
    }

    /// A topology from TOML (`docs/topology.md`; feature `toml`).
    ///
    /// # Errors
    ///
    /// As [`from_json_str`](Self::from_json_str).
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml_str(text: &str) -> Result<Topology> {
        let file: File = toml::from_str(text)
            .map_err(|e| Error::invalid(format!("the topology (TOML): {e}")))?;
        topology_of(file)
    }

    /// A topology from a file: TOML when its name ends in `.toml` (feature `toml`), else JSON.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when it cannot be read; as [`from_json_str`](Self::from_json_str),
    /// naming the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Topology> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            context: format!("reading the topology file {}", path.display()),
            source: e,
        })?;
        let named = |e: Error| match e {
            Error::InvalidArgument { reason } => Error::InvalidArgument {
                reason: format!("{}: {reason}", path.display()),
            },
            other => other,
        };
        if path.extension().is_some_and(|x| x == "toml") {
            #[cfg(feature = "toml")]
            return Topology::from_toml_str(&text).map_err(named);
            #[cfg(not(feature = "toml"))]
            return Err(Error::invalid(format!(
                "{}: a TOML topology needs the `toml` feature; JSON needs none",
                path.display()
            )));
        }
        Topology::from_json_str(&text).map_err(named)
    }
}
