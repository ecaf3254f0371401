//! The acknowledged consumer's test store.

use acemq_amqp::patterns::acknowledged::{CounterStore, CounterStoreOptions};

/// A counter store in `dir` (`counters.db`) that allows the counters `page_views` and `signups`,
/// its tables created.
pub fn counters(dir: &tempfile::TempDir) -> CounterStore {
    let store = CounterStore::new(
        dir.path().join("counters.db"),
        CounterStoreOptions::new().allow(["page_views", "signups"]),
    )
    .unwrap();
    store.create_tables().unwrap();
    store
}
