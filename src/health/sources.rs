//! The components that report on themselves ([`HealthSource`]) and the registry of them a
//! connection holds: `Weak` references, so a component appears while it runs and drops out when
//! it is closed (its `Arc` dropped) without telling anyone.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::report::HealthReport;

/// A component that reports on itself: a running consumer, a running relay. Its report must
/// come from what it already knows (counters, the time of its last settlement), never from a
/// round trip: [`Connection::health`](crate::Connection::health) asks every source on the
/// caller's thread.
pub trait HealthSource: Send + Sync {
    /// Its name in the aggregate (`consumer:orders`, `outbox-relay`).
    fn name(&self) -> String;
    /// What it finds now.
    fn report(&self) -> HealthReport;
}

/// The most sources one connection keeps: past it a new source is not registered (logged), so
/// a service that starts consumers in a loop without closing them cannot grow the list without
/// bound.
const MAX_SOURCES: usize = 4096;

/// The sources registered on one connection, as `Weak` references (pruned when asked).
#[derive(Default)]
pub(crate) struct HealthSources {
    sources: Mutex<Vec<Weak<dyn HealthSource>>>,
}

/// A source kept alive by its owner: dropping it takes the source out of the health answer.
pub(crate) struct Registered {
    _source: Arc<dyn HealthSource>,
}

impl HealthSources {
    /// Registers `source` and returns the handle that keeps it listed.
    pub(crate) fn register(&self, source: Arc<dyn HealthSource>) -> Registered {
        let mut sources = self.sources.lock();
        sources.retain(|w| w.strong_count() > 0);
        if sources.len() < MAX_SOURCES {
            sources.push(Arc::downgrade(&source));
        } else {
            log::warn!(
                "acemq: {MAX_SOURCES} health sources registered already; {} is not reported",
                source.name()
            );
        }
        Registered { _source: source }
    }

    /// The live sources, in the order they registered.
    pub(crate) fn live(&self) -> Vec<Arc<dyn HealthSource>> {
        let mut sources = self.sources.lock();
        sources.retain(|w| w.strong_count() > 0);
        sources.iter().filter_map(Weak::upgrade).collect()
    }
}
