//! Comparing the broker's queues and exchanges with specs, without changing them, by reading
//! its refusals of equivalent declarations.

use super::calls::{declare_exchange_on, map_err};
use super::spec::{ExchangeKind, ExchangeSpec, QueueSpec};
use crate::connection::Connection;
use crate::envelope::{check_name, HeaderValue};
use crate::error::{Error, Result};

/// One way the broker's queue or exchange differs from a spec (see
/// [`Connection::compare_queue`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyDifference {
    /// `"queue"` or `"exchange"`.
    pub kind: &'static str,
    /// The queue or exchange.
    pub name: String,
    /// The argument or property that differs (`x-message-ttl`, `durable`, `type`, …), or
    /// `"existence"` when the broker has no such queue or exchange.
    pub what: String,
    /// The spec's value (`none` when the spec does not set it), as the broker prints it.
    pub expected: String,
    /// The broker's value (`none` when it has none, `missing` when the queue or exchange is
    /// not there), as the broker prints it.
    pub actual: String,
}

impl std::fmt::Display for TopologyDifference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.what == "existence" {
            write!(f, "{} {:?} is missing", self.kind, self.name)
        } else {
            write!(
                f,
                "{} {:?}: {} is {} on the broker, expected {}",
                self.kind, self.name, self.what, self.actual, self.expected
            )
        }
    }
}

/// One inequivalence read from a 406 text: `(what, expected, actual, broker's value to adopt)`.
/// RabbitMQ writes `inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the
/// value '2000' of type 'signedint' but current is the value '1000' of type 'long'` (either
/// side may be `none`), and for the flags `received 'false' but current is 'true'`.
fn parse_inequivalence(reason: &str) -> Option<(String, String, String, Adopt)> {
    let rest = &reason[reason.find("inequivalent arg '")? + "inequivalent arg '".len()..];
    let what = &rest[..rest.find('\'')?];
    let rest = &rest[rest.find(": received ")? + ": received ".len()..];
    let split = rest.find(" but current is ")?;
    let (received, current) = (&rest[..split], &rest[split + " but current is ".len()..]);
    let value = |text: &str| -> Option<(String, Option<(String, String)>)> {
        let text = text.trim();
        if text == "none" {
            return Some(("none".into(), None));
        }
        if let Some(v) = text.strip_prefix("the value '") {
            let end = v.find("' of type '")?;
            let value = &v[..end];
            let ty = v[end + "' of type '".len()..].trim_end_matches('\'');
            return Some((value.to_string(), Some((value.to_string(), ty.to_string()))));
        }
        let v = text.trim_matches('\'');
        Some((v.to_string(), Some((v.to_string(), "bare".into()))))
    };
    let (expected, _) = value(received)?;
    let (actual, typed) = value(current)?;
    let adopt = match typed {
        None => Adopt::Remove,
        Some((v, ty)) => Adopt::Set(v, ty),
    };
    Some((what.to_string(), expected, actual, adopt))
}

/// What to declare next time to get past one inequivalence.
enum Adopt {
    Remove,
    Set(String, String),
}

fn adopt_value(value: &str, ty: &str) -> HeaderValue {
    match ty {
        "signedint" | "long" | "short" | "byte" | "unsignedbyte" | "unsignedshort"
        | "unsignedint" => value
            .parse::<i64>()
            .map(HeaderValue::Int)
            .unwrap_or_else(|_| HeaderValue::Text(value.to_string())),
        "bool" => HeaderValue::Bool(value == "true"),
        "double" | "float" => value
            .parse::<f64>()
            .map(HeaderValue::Float)
            .unwrap_or_else(|_| HeaderValue::Text(value.to_string())),
        // The broker prints numeric arguments it checks by value (`x-message-ttl`,
        // `x-max-length`, …) bare: `received '40000' but current is '30000'`.
        "bare" => match value.parse::<i64>() {
            Ok(i) => HeaderValue::Int(i),
            Err(_) => HeaderValue::Text(value.to_string()),
        },
        _ => HeaderValue::Text(value.to_string()),
    }
}

/// At most this many inequivalences are read from one queue or exchange.
const MAX_DIFFERENCES: usize = 32;

impl Connection {
    /// Compares the broker's queue with `spec`, argument by argument, **without changing it**:
    /// every difference in `x-queue-type`, each argument, `durable`, `exclusive` and
    /// `auto_delete`, or one `existence` difference when the queue is not there. An empty list
    /// means the broker's queue is what `spec` declares. Nothing is remembered for recovery.
    ///
    /// AMQP cannot read a queue's arguments, so this asks the broker to declare the queue as
    /// `spec` says (after a passive check that it exists, so that a missing queue is reported
    /// and not created): an equivalent declaration changes nothing, an inequivalent one is
    /// refused (406) with the broker's account of the first difference, which is recorded, then
    /// adopted into the next declaration to find the next one, on a fresh channel each time.
    /// (A queue deleted by someone else between the passive check and the declaration would be
    /// created; nothing else can be.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name; [`Error::ConnectionLost`] / [`Error::Amqp`] when
    /// the broker cannot be asked; [`Error::TopologyConflict`] when the broker's refusal cannot
    /// be read.
    pub fn compare_queue(&self, spec: &QueueSpec) -> Result<Vec<TopologyDifference>> {
        spec.validate()?;
        check_name("queue", &spec.name, false)?;
        let present = self.queue_info(&spec.name).map(|_| ());
        let mut options = spec.options();
        self.walk_differences("queue", &spec.name, present, |adopted| {
            if let Some((what, actual, adopt)) = adopted {
                match (what, adopt) {
                    ("durable", _) => options.durable = actual == "true",
                    ("exclusive", _) => options.exclusive = actual == "true",
                    ("auto_delete", _) => options.auto_delete = actual == "true",
                    (name, Adopt::Remove) => {
                        options.arguments.remove(name);
                    }
                    (name, Adopt::Set(value, ty)) => {
                        options
                            .arguments
                            .insert(name.to_string(), adopt_value(value, ty).to_amqp());
                    }
                }
            }
            let attempt = options.clone();
            self.with_channel(|c| {
                c.queue_declare(spec.name.clone(), attempt)
                    .map(|_| ())
                    .map_err(|e| map_err("queue", &spec.name, "comparing", e))
            })
        })
    }

    /// Compares the broker's exchange with `spec` (type, `durable`, `auto_delete`, `internal`,
    /// arguments) without changing it, as [`compare_queue`](Self::compare_queue) does for a
    /// queue.
    ///
    /// # Errors
    ///
    /// As [`compare_queue`](Self::compare_queue).
    pub fn compare_exchange(&self, spec: &ExchangeSpec) -> Result<Vec<TopologyDifference>> {
        check_name("exchange", &spec.name, false)?;
        let present = self.check_exchange(&spec.name);
        let mut current = spec.clone();
        self.walk_differences("exchange", &spec.name, present, |adopted| {
            if let Some((what, actual, adopt)) = adopted {
                match (what, adopt) {
                    ("type", _) => {
                        current.kind = match actual {
                            "direct" => ExchangeKind::Direct,
                            "fanout" => ExchangeKind::Fanout,
                            "topic" => ExchangeKind::Topic,
                            "headers" => ExchangeKind::Headers,
                            other => ExchangeKind::Custom(other.to_string()),
                        }
                    }
                    ("durable", _) => current.durable = actual == "true",
                    ("auto_delete", _) => current.auto_delete = actual == "true",
                    ("internal", _) => current.internal = actual == "true",
                    (name, Adopt::Remove) => {
                        current.arguments.remove(name);
                    }
                    (name, Adopt::Set(value, ty)) => {
                        current
                            .arguments
                            .insert(name.to_string(), adopt_value(value, ty));
                    }
                }
            }
            self.with_channel(|c| declare_exchange_on(c, &current))
        })
    }

    /// The walk both comparisons share: `present` is the passive check (a missing object is one
    /// difference, nothing declared); then `declare` is asked — first as the spec says, then
    /// with each difference the broker names adopted (`Some((what, actual, adopt))`) — until the
    /// broker accepts. A refusal that cannot be read, or one that adopting did not cure, is
    /// returned as the broker's `TopologyConflict`.
    fn walk_differences(
        &self,
        kind: &'static str,
        name: &str,
        present: Result<()>,
        mut declare: impl FnMut(Option<(&str, &str, &Adopt)>) -> Result<()>,
    ) -> Result<Vec<TopologyDifference>> {
        let difference = |what: &str, expected: &str, actual: &str| TopologyDifference {
            kind,
            name: name.to_string(),
            what: what.into(),
            expected: expected.into(),
            actual: actual.into(),
        };
        match present {
            Ok(()) => {}
            Err(Error::NotFound { .. }) => {
                return Ok(vec![difference("existence", "present", "missing")])
            }
            Err(e) => return Err(e),
        }
        let conflict = |reason: String| Error::TopologyConflict {
            kind,
            name: name.to_string(),
            reason,
        };
        let mut found: Vec<TopologyDifference> = Vec::new();
        let mut adopted: Option<(String, String, Adopt)> = None;
        while found.len() < MAX_DIFFERENCES {
            let asked = declare(
                adopted
                    .as_ref()
                    .map(|(w, a, ad)| (w.as_str(), a.as_str(), ad)),
            );
            let reason = match asked {
                Ok(()) => return Ok(found),
                Err(Error::TopologyConflict { reason, .. }) => reason,
                Err(e) => return Err(e),
            };
            let Some((what, expected, actual, adopt)) = parse_inequivalence(&reason) else {
                return Err(conflict(reason));
            };
            if found.iter().any(|d| d.what == what && d.actual == actual) {
                // Adopting the broker's value did not satisfy it: report what it said.
                return Err(conflict(reason));
            }
            found.push(difference(&what, &expected, &actual));
            adopted = Some((what, actual, adopt));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_brokers_inequivalence_texts() {
        let (what, expected, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': \
             received the value '2000' of type 'long' but current is the value '1000' of type \
             'signedint'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str()),
            ("x-message-ttl", "2000")
        );
        assert_eq!(actual, "1000");
        assert!(matches!(adopt, Adopt::Set(v, t) if v == "1000" && t == "signedint"));
        // As RabbitMQ 3.10 words it for x-message-ttl.
        let (what, expected, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': \
             received '40000' but current is '30000'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str(), actual.as_str()),
            ("x-message-ttl", "40000", "30000")
        );
        let Adopt::Set(v, t) = adopt else { panic!() };
        assert_eq!(adopt_value(&v, &t), HeaderValue::Int(30000));
        let (what, _, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': \
             received the value '5' of type 'long' but current is none",
        )
        .unwrap();
        assert_eq!((what.as_str(), actual.as_str()), ("x-max-length", "none"));
        assert!(matches!(adopt, Adopt::Remove));
        let (what, expected, actual, _) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': \
             received 'false' but current is 'true'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str(), actual.as_str()),
            ("durable", "false", "true")
        );
        assert!(parse_inequivalence("something else").is_none());
    }
}
