//! The two wire forms: the JSON slip and the declared route, read from and written onto a
//! message; sending a slip to its first stop.

use serde::{Deserialize, Serialize};

use super::slip::{RoutingSlip, SlipForm, SlipStep};
use crate::envelope::{headers, new_id, HeaderValue, Message};
use crate::error::FatalError;
use crate::error::{Error, Result};
use crate::publish::Publisher;

/// A slip as read: every field forgiving.
#[derive(Deserialize)]
struct WireSlip {
    #[serde(default)]
    steps: Option<Vec<WireStep>>,
    #[serde(default)]
    done: Option<Vec<WireStep>>,
}

#[derive(Deserialize)]
struct WireStep {
    #[serde(default)]
    exchange: Option<String>,
    #[serde(default, rename = "routingKey")]
    routing_key: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "completedAt")]
    completed_at: Option<String>,
}

impl From<WireStep> for SlipStep {
    fn from(w: WireStep) -> SlipStep {
        SlipStep {
            exchange: w.exchange.unwrap_or_default(),
            routing_key: w.routing_key.unwrap_or_default(),
            name: w.name.filter(|n| !n.is_empty()),
            completed_at: w.completed_at.filter(|c| !c.is_empty()),
        }
    }
}

impl RoutingSlip {
    /// The JSON form (whatever form the slip is written in).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            steps: &'a [SlipStep],
            done: &'a [SlipStep],
        }
        // Strings and optional strings only: serialising cannot fail.
        serde_json::to_string(&Out {
            steps: &self.steps,
            done: &self.done,
        })
        .unwrap_or_default()
    }

    /// Reads the JSON form.
    ///
    /// # Errors
    ///
    /// [`FatalError`] when `json` is not a slip.
    pub fn from_json(json: &str) -> Result<RoutingSlip, FatalError> {
        let wire: WireSlip = serde_json::from_str(json).map_err(|e| {
            FatalError::new(format!(
                "the routing slip cannot be read ({e}): {json:.200}"
            ))
        })?;
        Ok(RoutingSlip {
            steps: wire
                .steps
                .unwrap_or_default()
                .into_iter()
                .map(Into::into)
                .collect(),
            done: wire
                .done
                .unwrap_or_default()
                .into_iter()
                .map(Into::into)
                .collect(),
            form: SlipForm::Json,
            route_id: None,
        })
    }

    /// Writes the slip onto `message` in its form, removing the other form.
    pub(super) fn write_onto(&self, message: &mut Message) -> Result<()> {
        match self.form {
            SlipForm::Json => {
                for h in [headers::ROUTE, headers::ROUTE_POSITION, headers::ROUTE_ID] {
                    message.engine_headers.remove(h);
                }
                message.headers.insert(
                    headers::ROUTING_SLIP.into(),
                    HeaderValue::Text(self.to_json()),
                );
            }
            SlipForm::StepNames => {
                let names = self.step_names()?;
                message.headers.remove(headers::ROUTING_SLIP);
                let e = &mut message.engine_headers;
                e.insert(headers::ROUTE.into(), HeaderValue::Text(names.join(",")));
                e.insert(
                    headers::ROUTE_POSITION.into(),
                    HeaderValue::Int(i64::try_from(self.done.len()).unwrap_or(i64::MAX)),
                );
                let id = self.route_id.clone().unwrap_or_else(new_id);
                e.insert(headers::ROUTE_ID.into(), HeaderValue::Text(id));
            }
        }
        Ok(())
    }

    /// A declared slip read without a pipeline, resolved against `pipeline` (`""`: the default
    /// exchange).
    pub(super) fn resolved(mut self, pipeline: &str) -> RoutingSlip {
        if self.form == SlipForm::StepNames {
            for s in self.steps.iter_mut().chain(self.done.iter_mut()) {
                s.exchange = pipeline.to_string();
            }
        }
        self
    }

    /// Publishes `payload` to this slip's first stop (mandatory, confirmed), carrying the slip in
    /// its [form](Self::form) (JSON unless the slip is declared; another form:
    /// [`with_form`](Self::with_form) first), and waits for the confirm.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a slip without steps or one that cannot be said in its
    /// form (nothing is published); the publisher's errors ([`Error::Unroutable`] when nothing
    /// is bound at the first stop, …).
    pub fn send(&self, publisher: &Publisher, payload: impl Into<Message>) -> Result<()> {
        let Some(first) = self.next().cloned() else {
            return Err(Error::invalid("the routing slip has no steps"));
        };
        let mut message = payload.into();
        self.write_onto(&mut message)?;
        publisher.publish_routed(&first.exchange, &first.routing_key, message)
    }
}

/// Reads the slip a message carries, in either form (JSON first when both are present).
/// Steps of a declared route come back on the default exchange, their names as routing keys.
///
/// # Errors
///
/// [`FatalError`] when the message carries a slip that cannot be read.
pub fn slip_from(message: &Message) -> Result<Option<RoutingSlip>, FatalError> {
    if let Some(raw) = message.headers.get(headers::ROUTING_SLIP) {
        let text = match raw {
            HeaderValue::Text(s) => s.clone(),
            HeaderValue::Bytes(b) => String::from_utf8(b.clone()).map_err(|_| {
                FatalError::new(format!(
                    "the routing slip on message {} is not UTF-8",
                    message.id()
                ))
            })?,
            other => {
                return Err(FatalError::new(format!(
                    "the routing slip on message {} is not text: {other:?}",
                    message.id()
                )))
            }
        };
        if !text.is_empty() {
            return RoutingSlip::from_json(&text)
                .map(Some)
                .map_err(|e| FatalError::new(format!("message {}: {e}", message.id())));
        }
    }
    let text = |name: &str| match message.engine_headers.get(name) {
        Some(HeaderValue::Text(s)) => Some(s.clone()),
        Some(HeaderValue::Bytes(b)) => String::from_utf8(b.clone()).ok(),
        _ => None,
    };
    let Some(route) = text(headers::ROUTE).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let names: Vec<&str> = route.split(',').map(str::trim).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(FatalError::new(format!(
            "the declared route on message {} has an empty step name: {route:?}",
            message.id()
        )));
    }
    let position = match message.engine_headers.get(headers::ROUTE_POSITION) {
        Some(HeaderValue::Int(i)) => *i,
        Some(HeaderValue::Text(s)) => s.trim().parse().unwrap_or(0),
        Some(HeaderValue::Bytes(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    let at = usize::try_from(position.max(0))
        .unwrap_or(usize::MAX)
        .min(names.len());
    let step = |n: &str| SlipStep {
        exchange: String::new(),
        routing_key: n.to_string(),
        name: Some(n.to_string()),
        completed_at: None,
    };
    Ok(Some(RoutingSlip {
        done: names[..at].iter().map(|n| step(n)).collect(),
        steps: names[at..].iter().map(|n| step(n)).collect(),
        form: SlipForm::StepNames,
        route_id: text(headers::ROUTE_ID).filter(|r| !r.is_empty()),
    }))
}
