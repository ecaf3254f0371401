//! What a connection keeps for [`Connection::health`](super::Connection::health): the
//! registered sources, the application's checks, the broker round trip's probe, when the
//! supervisor last lost and regained the link.

use std::time::SystemTime;

use parking_lot::Mutex;

use crate::health::{AppChecks, HealthSources, Probe, ROUND_TRIP_DEADLINE, ROUND_TRIP_REUSE};

/// What the connection keeps for its health answer.
pub(crate) struct HealthState {
    pub(crate) sources: HealthSources,
    pub(super) checks: AppChecks,
    /// When the link last came back, and when it was last lost.
    pub(super) reconnects: Mutex<Reconnects>,
    /// The broker link's round trip, run once at a time and reused for a while.
    pub(super) round_trip: Probe,
}

impl Default for HealthState {
    fn default() -> HealthState {
        HealthState {
            sources: HealthSources::default(),
            checks: AppChecks::default(),
            reconnects: Mutex::default(),
            round_trip: Probe::new(ROUND_TRIP_DEADLINE, ROUND_TRIP_REUSE),
        }
    }
}

#[derive(Default)]
pub(super) struct Reconnects {
    pub(super) last_reconnect: Option<SystemTime>,
    pub(super) lost_at: Option<SystemTime>,
}

impl HealthState {
    /// The supervisor brought a new link up.
    pub(super) fn reconnected(&self) {
        self.reconnects.lock().last_reconnect = Some(SystemTime::now());
    }

    /// The supervisor saw the link drop.
    pub(super) fn lost(&self) {
        self.reconnects.lock().lost_at = Some(SystemTime::now());
    }
}
