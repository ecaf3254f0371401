//! What a connection keeps for [`Connection::health`](super::Connection::health): the
//! registered sources, the application's checks, when the supervisor last lost and regained
//! the link.

use std::time::SystemTime;

use parking_lot::Mutex;

use crate::health::{AppChecks, HealthSources};

/// What the connection keeps for its health answer.
#[derive(Default)]
pub(crate) struct HealthState {
    pub(crate) sources: HealthSources,
    pub(super) checks: AppChecks,
    /// When the link last came back, and when it was last lost.
    pub(super) reconnects: Mutex<Reconnects>,
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
