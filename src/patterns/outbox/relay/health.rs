//! A running relay's health report (`outbox-relay`): its backlog (records waiting, the age of
//! the oldest) as last counted, the lag of the last record it published, and its last sweep's
//! error, against the thresholds of its options.

use std::sync::Arc;
use std::time::Duration;

use super::state::Core;
use crate::health::{HealthReport, HealthSource, HealthStatus};

/// What a running relay shows in [`Connection::health`](crate::Connection::health).
pub(super) struct RelayHealth {
    pub(super) core: Arc<Core>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl HealthSource for RelayHealth {
    fn name(&self) -> String {
        "outbox-relay".into()
    }

    fn report(&self) -> HealthReport {
        let o = &self.core.options;
        let stats = self.core.health.lock();
        let mut report = HealthReport::up()
            .part("backlogThreshold", o.health_backlog)
            .part("oldestPendingThresholdMillis", ms(o.health_oldest_pending))
            .part("lagThresholdMillis", ms(o.health_lag));
        if let Some((pending, oldest, at)) = stats.backlog {
            report = report
                .part("backlog", pending)
                .part(
                    "oldestPendingMillis",
                    oldest.map_or(serde_json::Value::Null, |d| ms(d).into()),
                )
                .part("countedMillisAgo", ms(at.elapsed()));
            if pending > o.health_backlog {
                report.worsen(
                    HealthStatus::Degraded,
                    &format!(
                        "{pending} records wait in the outbox (threshold {})",
                        o.health_backlog
                    ),
                );
            }
            if let Some(oldest) = oldest.filter(|d| *d > o.health_oldest_pending) {
                report.worsen(
                    HealthStatus::Degraded,
                    &format!(
                        "the oldest pending record waits for {oldest:?} (threshold {:?})",
                        o.health_oldest_pending
                    ),
                );
            }
        }
        if let Some(lag) = stats.last_lag {
            report = report.part("lagMillis", ms(lag));
            if lag > o.health_lag {
                report.worsen(
                    HealthStatus::Degraded,
                    &format!(
                        "the last record went out {lag:?} after its commit (threshold {:?})",
                        o.health_lag
                    ),
                );
            }
        }
        if let Some(e) = &stats.last_error {
            report.worsen(
                HealthStatus::Degraded,
                &format!("the last sweep failed: {e}"),
            );
            report = report.part("lastError", e.clone());
        }
        report
    }
}
