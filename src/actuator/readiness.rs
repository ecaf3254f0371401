//! [`Readiness`]: whether the service is draining, which `/readyz` and `/acemq-health` report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether the service is draining, shared with a
/// [`RunningActuator`](super::RunningActuator) (from
/// [`RunningActuator::readiness`](super::RunningActuator::readiness)): while it is,
/// `/readyz` and `/acemq-health` answer 503 (`"status":"down"`, `"reason":"draining"`) so the
/// orchestrator takes the instance out of rotation, and `/livez` still answers 200 so it is
/// not restarted. `Clone + Send + Sync`; every clone flips the same state, from any thread.
#[derive(Clone)]
pub struct Readiness {
    draining: Arc<AtomicBool>,
}

impl Readiness {
    pub(super) fn new() -> Readiness {
        Readiness {
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts (`true`) or ends (`false`) draining; seen by the next answer.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::SeqCst);
    }

    /// Whether it is draining (`false` until [`set_draining`](Self::set_draining)`(true)`).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("draining", &self.is_draining())
            .finish()
    }
}
