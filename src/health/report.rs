//! The family's health data: three statuses, a report per component, the aggregate, and their
//! JSON (`status`, `detail`, `checked`, `parts`, as Python's `HealthReport` and Go's
//! `HealthReport` write it).

use std::time::SystemTime;

use serde_json::{Map, Value};

/// How a component turned out: the family's three words. Ordered from best to worst, so the
/// worst of several is their [`max`](Ord::max).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HealthStatus {
    /// Working (`up`).
    Up,
    /// Working, but not as well as it should (`degraded`): worth an alert, not worth taking
    /// the instance out of rotation (its replacement would almost certainly be degraded too).
    Degraded,
    /// Not working (`down`): a readiness probe should fail on this.
    Down,
}

impl HealthStatus {
    /// The family's word: `up`, `degraded` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Up => "up",
            HealthStatus::Degraded => "degraded",
            HealthStatus::Down => "down",
        }
    }
}

impl std::fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one component (or one of the application's checks) found: a status, why (when not
/// simply up), and whatever it wants to show in `parts` (counts, ages, flags).
#[derive(Clone, Debug, PartialEq)]
pub struct HealthReport {
    /// Up, degraded or down.
    pub status: HealthStatus,
    /// Why, when it is not simply up; empty otherwise.
    pub detail: String,
    /// What it shows beside the status, written as the JSON object `parts`. Keys are
    /// camelCase, as the Go, Java and .NET libraries write them (`roundTripMillis`,
    /// `blockedReason`, `inFlight`).
    pub parts: Map<String, Value>,
}

impl HealthReport {
    /// A report with this status and detail and no parts.
    pub fn new(status: HealthStatus, detail: impl Into<String>) -> HealthReport {
        HealthReport {
            status,
            detail: detail.into(),
            parts: Map::new(),
        }
    }

    /// Up, without detail.
    pub fn up() -> HealthReport {
        HealthReport::new(HealthStatus::Up, "")
    }

    /// Degraded, saying why.
    pub fn degraded(detail: impl Into<String>) -> HealthReport {
        HealthReport::new(HealthStatus::Degraded, detail)
    }

    /// Down, saying why.
    pub fn down(detail: impl Into<String>) -> HealthReport {
        HealthReport::new(HealthStatus::Down, detail)
    }

    /// Adds one entry to [`parts`](Self::parts).
    #[must_use]
    pub fn part(mut self, key: &str, value: impl Into<Value>) -> HealthReport {
        self.parts.insert(key.to_string(), value.into());
        self
    }

    /// Moves the status to `status` when that is worse, joining `why` to the detail.
    pub(crate) fn worsen(&mut self, status: HealthStatus, why: &str) {
        self.status = self.status.max(status);
        if !why.is_empty() {
            if !self.detail.is_empty() {
                self.detail.push_str("; ");
            }
            self.detail.push_str(why);
        }
    }

    fn to_value(&self, checked: SystemTime) -> Value {
        let mut map = Map::new();
        map.insert("status".into(), self.status.as_str().into());
        if !self.detail.is_empty() {
            map.insert("detail".into(), self.detail.clone().into());
        }
        map.insert("checked".into(), rfc3339(checked).into());
        if !self.parts.is_empty() {
            map.insert("parts".into(), Value::Object(self.parts.clone()));
        }
        Value::Object(map)
    }
}

/// The answer of [`Connection::health`](crate::Connection::health): every component's report
/// under its name, and the worst of their statuses. `detail` says, for each component that is
/// not up or has something to say, `name: detail` (`consumer:orders: stopped; broker: the
/// broker has blocked this connection; …`), as Go's aggregate does.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    /// The worst of the components' statuses (`up` when there are none).
    pub status: HealthStatus,
    /// `name: detail` of each component that is not up or has a detail, joined with `; `;
    /// empty when there is none.
    pub detail: String,
    /// When this was worked out.
    pub checked: SystemTime,
    /// Each component's report, under its name, in the order they were asked.
    pub components: Vec<(String, HealthReport)>,
}

impl Health {
    /// The aggregate of these components: the worst status wins.
    pub(crate) fn of(components: Vec<(String, HealthReport)>) -> Health {
        let status = components
            .iter()
            .map(|(_, r)| r.status)
            .max()
            .unwrap_or(HealthStatus::Up);
        let detail = components
            .iter()
            .filter(|(_, r)| r.status != HealthStatus::Up || !r.detail.is_empty())
            .map(|(n, r)| {
                if r.detail.is_empty() {
                    n.clone()
                } else {
                    format!("{n}: {}", r.detail)
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        Health {
            status,
            detail,
            checked: SystemTime::now(),
            components,
        }
    }

    /// The report of the component named `name` (`broker`, `consumer:orders`, a check's
    /// name), if there is one.
    pub fn component(&self, name: &str) -> Option<&HealthReport> {
        self.components
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
    }

    /// Whether a readiness probe should pass: anything but down (degraded passes, as in the
    /// family).
    pub fn is_healthy(&self) -> bool {
        self.status != HealthStatus::Down
    }

    /// The family's JSON as a value: `{"status", "detail" (when not empty), "checked" (RFC
    /// 3339, UTC, milliseconds), "parts": {name: {"status", "detail", "checked", "parts"}}}`.
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("status".into(), self.status.as_str().into());
        if !self.detail.is_empty() {
            map.insert("detail".into(), self.detail.clone().into());
        }
        map.insert("checked".into(), rfc3339(self.checked).into());
        let parts: Map<String, Value> = self
            .components
            .iter()
            .map(|(n, r)| (n.clone(), r.to_value(self.checked)))
            .collect();
        map.insert("parts".into(), Value::Object(parts));
        Value::Object(map)
    }

    /// [`to_value`](Self::to_value) as JSON text.
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }
}

impl std::fmt::Display for Health {
    /// `up`, or `degraded: consumer:orders: stopped` (the family's `status: detail`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.detail.is_empty() {
            f.write_str(self.status.as_str())
        } else {
            write!(f, "{}: {}", self.status, self.detail)
        }
    }
}

/// `2026-12-03T06:47:28.123Z`.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_wins_and_degraded_is_not_down() {
        let h = Health::of(vec![
            ("broker".into(), HealthReport::up()),
            ("relay".into(), HealthReport::degraded("behind")),
        ]);
        assert_eq!(h.status, HealthStatus::Degraded);
        assert!(h.is_healthy());
        assert_eq!(h.detail, "relay: behind");
        let h = Health::of(vec![
            ("a".into(), HealthReport::degraded("x")),
            ("b".into(), HealthReport::down("y")),
        ]);
        assert_eq!(h.status, HealthStatus::Down);
        assert!(!h.is_healthy());
        let json = h.to_value();
        assert_eq!(json["status"], "down");
        assert_eq!(json["parts"]["b"]["detail"], "y");
        assert_eq!(json["detail"], "a: x; b: y");
        // Up with something to say (a blocked connection) is named too, as Go's aggregate does.
        let h = Health::of(vec![
            ("broker".into(), HealthReport::up()),
            ("c".into(), HealthReport::new(HealthStatus::Up, "blocked")),
        ]);
        assert_eq!(h.status, HealthStatus::Up);
        assert_eq!(h.to_string(), "up: c: blocked");
        assert!(json["checked"].as_str().unwrap().ends_with('Z'));
    }
}
