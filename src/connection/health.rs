//! [`Connection::health`]: the broker link's report (connected, blocked, reconnects), the
//! registered sources' (running consumers and relays), the application's checks; and what the
//! supervisor records for it (`health_state.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::handle::Connection;
use super::shared::LinkState;
use crate::error::Result;
use crate::health::{
    rfc3339, Health, HealthReport, HealthSource, HealthStatus, Registered, Started,
};

/// A blocked connection's detail, the family's words (Go's `blockedPrefix`, Python's
/// `BLOCKED_DETAIL`); `: {reason}` follows when the broker gave one.
const BLOCKED_DETAIL: &str = "the broker has blocked this connection; publishing is paused";

impl Connection {
    /// How this connection and what runs on it are doing, as the family reports it: the broker
    /// link (`broker`: down while not connected, or when the broker does not answer a round
    /// trip within [`ROUND_TRIP_DEADLINE`](crate::health::ROUND_TRIP_DEADLINE); up, saying so,
    /// while the broker blocks publishing — a memory or disk alarm), each running consumer
    /// (`consumer:{queue}`), each running outbox relay (`outbox-relay`), and each of the
    /// application's checks ([`add_health_check`](Self::add_health_check)) under its name; the
    /// worst status wins.
    ///
    /// The link's report asks the broker (see [`health`](crate::health)): one round trip at a
    /// time, its answer reused for [`ROUND_TRIP_REUSE`](crate::health::ROUND_TRIP_REUSE), so
    /// frequent probes cost the broker little. Consumers and relays report what they already
    /// know. The round trip and the application's checks run at once, each on a thread of its
    /// own, and each is waited for up to its deadline, so this returns within the longest
    /// deadline; a check past its deadline is reported down (`did not answer within …`), and
    /// one still running from an earlier call is not started again while it runs.
    pub fn health(&self) -> Health {
        // Started first, waited for last: it runs while the others are asked.
        let round_trip = self.start_round_trip();
        let mut components: Vec<(String, HealthReport)> = Vec::new();
        for source in self.shared.health.sources.live() {
            let mut name = source.name();
            let taken = |n: &str, c: &[(String, HealthReport)]| c.iter().any(|(x, _)| x == n);
            if taken(&name, &components) {
                let base = name.clone();
                let mut k = 2;
                while taken(&name, &components) {
                    name = format!("{base}#{k}");
                    k += 1;
                }
            }
            components.push((name, source.report()));
        }
        for (name, report) in self.shared.health.checks.run_all() {
            components.push((name, report));
        }
        let consumers = components
            .iter()
            .filter(|(n, _)| n.starts_with("consumer:"))
            .count();
        let broker = self.link_health(round_trip).part("consumers", consumers);
        components.insert(0, ("broker".into(), broker));
        Health::of(components)
    }

    /// Registers one of the application's own checks (a database, a downstream service) under
    /// `name`: [`health`](Self::health) runs `check` on a thread of its own and waits for it
    /// up to the options' [`deadline`](crate::health::HealthCheckOptions::deadline) (by default
    /// the family's 5 s); past it the check counts as down. A check that panics counts as
    /// down too. Every clone of this connection shares the checks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty name, a zero
    /// deadline, a name registered already, or more than 256 checks.
    pub fn add_health_check<F>(
        &self,
        name: &str,
        options: crate::health::HealthCheckOptions,
        check: F,
    ) -> Result<()>
    where
        F: Fn() -> HealthReport + Send + Sync + 'static,
    {
        self.shared
            .health
            .checks
            .add(name, &options, Arc::new(check))
    }

    /// Removes the check registered under `name`; false when there was none. A run of it still
    /// under way ends on its thread, unread.
    pub fn remove_health_check(&self, name: &str) -> bool {
        self.shared.health.checks.remove(name)
    }

    /// Lists `source` in [`health`](Self::health) for as long as the returned handle lives.
    pub(crate) fn register_health(&self, source: Arc<dyn HealthSource>) -> Registered {
        self.shared.health.sources.register(source)
    }

    /// Starts (or joins, or reuses) the round trip, unless the link is not up or the broker
    /// blocks it (it reads nothing from a blocked connection: the round trip could only time
    /// out).
    fn start_round_trip(&self) -> Option<Started> {
        let up = matches!(&*self.shared.state.lock(), LinkState::Up(_));
        if !up || self.shared.blocked.lock().is_some() {
            return None;
        }
        let connection = self.clone();
        Some(
            self.shared
                .health
                .round_trip
                .start("acemq-health-broker", move || {
                    let started = Instant::now();
                    match connection.round_trip() {
                        Ok(()) => HealthReport::up().part(
                            "roundTripMillis",
                            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        ),
                        Err(e) => HealthReport::down(format!("the broker did not answer: {e}")),
                    }
                }),
        )
    }

    /// The broker link's report, with the round trip's answer.
    fn link_health(&self, round_trip: Option<Started>) -> HealthReport {
        let reconnects = {
            let r = self.shared.health.reconnects.lock();
            (r.last_reconnect, r.lost_at)
        };
        let mut report = match &*self.shared.state.lock() {
            LinkState::Up(link) => HealthReport::up()
                .part("connected", true)
                .part("address", link.address.clone())
                .part("generation", link.generation)
                .part("reconnects", link.generation.saturating_sub(1)),
            LinkState::Down { last_error } => {
                HealthReport::down(format!("not connected, reconnecting: {last_error}"))
                    .part("connected", false)
                    .part("lastError", last_error.clone())
            }
            LinkState::Closed => {
                HealthReport::down("the connection has been closed").part("connected", false)
            }
        };
        if let Some(at) = reconnects.0 {
            report = report.part("lastReconnect", rfc3339(at));
        }
        if let Some(at) = reconnects.1 {
            report = report.part("lastLost", rfc3339(at));
        }
        let blocked = self.shared.blocked.lock().clone();
        report = report.part("blocked", blocked.is_some());
        if let Some(reason) = blocked {
            // Up, saying so, as the family reports it: working, only publishing is paused.
            report.worsen(HealthStatus::Up, &format!("{BLOCKED_DETAIL}: {reason}"));
            report = report.part("blockedReason", reason);
        }
        let deadline = self.shared.health.round_trip.deadline();
        let late = || format!("the broker did not answer within {deadline:?}");
        match round_trip {
            None => {}
            Some(Started::Run(run)) => match self.shared.health.round_trip.wait(&run) {
                Some(answer) if answer.status == HealthStatus::Up => {
                    report.parts.extend(answer.parts);
                }
                Some(answer) => report.worsen(HealthStatus::Down, &answer.detail),
                None => report.worsen(HealthStatus::Down, &late()),
            },
            Some(Started::Busy(since)) => report.worsen(
                HealthStatus::Down,
                &format!("{} (asked {since:?} ago, still waiting)", late()),
            ),
            Some(Started::Failed(e)) => report.worsen(
                HealthStatus::Down,
                &format!("the round trip could not be started: {e}"),
            ),
        }
        report
    }
}

// Only the actuator's `/acemq-info` reads it: without the feature it would be dead code.
#[cfg(feature = "actuator")]
impl Connection {
    /// The address of the current link (its password never shown), or `None` while not
    /// connected.
    pub(crate) fn current_address(&self) -> Option<String> {
        match &*self.shared.state.lock() {
            LinkState::Up(link) => Some(link.address.clone()),
            _ => None,
        }
    }
}
