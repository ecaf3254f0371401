//! The in-memory stores follow the same rules as the SQL ones.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{
    Claim, ClaimToken, IdempotencyStore, InMemoryIdempotencyStore,
};
use acemq_amqp::patterns::outbox::{
    InMemoryOutboxStore, InMemoryOutboxStoreOptions, NewOutboxRecord, OutboxStore,
};
use acemq_amqp::patterns::schema_registry::{InMemorySchemaRegistry, SchemaRegistry};
use acemq_amqp::Error;

#[test]
fn idempotency_claims_ttl_and_race() {
    let store = Arc::new(InMemoryIdempotencyStore::new(Duration::from_millis(200)));
    assert!(store.supports_claims());
    assert!(store.claim("a").unwrap().is_claimed());
    assert_eq!(store.claim("a").unwrap(), Claim::InProgress);
    thread::sleep(Duration::from_millis(300));
    let taken = store.claim("a").unwrap(); // lease taken over
    store.confirm("a", taken.token().unwrap()).unwrap();
    assert_eq!(store.claim("a").unwrap(), Claim::Duplicate);
    store.forget("a").unwrap();
    assert!(store.first_time("a").unwrap());
    assert!(!store.first_time("a").unwrap());
    thread::sleep(Duration::from_millis(300));
    assert_eq!(store.purge_expired(), 1);
    assert!(store.is_empty());

    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                store.claim("race").unwrap()
            })
        })
        .collect();
    let claimed = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(Claim::is_claimed)
        .count();
    assert_eq!(claimed, 1);
}

/// Waits (with a deadline) until a claim of `key` takes the lease over; returns its token.
fn take_over(store: &InMemoryIdempotencyStore, key: &str) -> ClaimToken {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Claim::Claimed(token) = store.claim(key).unwrap() {
            return token;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never ran out"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn taken_over_claim_keeps_the_first_holders_receipt_in_memory() {
    let store = InMemoryIdempotencyStore::new(Duration::from_secs(1));
    let a = take_over(&store, "k"); // A: a new key, claimed at once
    let b = take_over(&store, "k"); // B, once A's lease ran out
    store.confirm("k", &a).unwrap(); // A finished
    store.release("k", &b).unwrap(); // B failed
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
}

#[test]
fn stale_holder_cannot_forget_the_new_holders_claim_in_memory() {
    let store = InMemoryIdempotencyStore::new(Duration::from_secs(1));
    let a = take_over(&store, "k"); // A
    let b = take_over(&store, "k"); // B
    store.release("k", &a).unwrap(); // A failed
    assert_eq!(
        store.claim("k").unwrap(),
        Claim::InProgress,
        "B still holds it"
    );
    store.confirm("k", &b).unwrap();
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
}

#[test]
fn outbox_order_leases_retirement_release() {
    let store = InMemoryOutboxStore::open(
        InMemoryOutboxStoreOptions::default()
            .max_attempts(2)
            .lease(Duration::from_millis(200)),
    )
    .unwrap();
    let ids: Vec<i64> = (0..3)
        .map(|n| {
            store
                .add(&NewOutboxRecord {
                    exchange: "x".into(),
                    routing_key: format!("k{n}"),
                    body: vec![n],
                    ..Default::default()
                })
                .unwrap()
        })
        .collect();
    let first = store.pending(2).unwrap();
    assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), ids[..2]);
    assert_eq!(store.pending(10).unwrap().len(), 1); // only the unleased one
    assert!(store.pending(10).unwrap().is_empty());
    store.record_failure(ids[0], "boom").unwrap();
    store.record_failure(ids[0], "boom again").unwrap();
    assert_eq!(
        store.retired().unwrap()[0].last_error.as_deref(),
        Some("boom again")
    );
    thread::sleep(Duration::from_millis(300));
    let again = store.pending(10).unwrap();
    assert_eq!(again.iter().map(|r| r.id).collect::<Vec<_>>(), ids[1..]);
    store.release(ids[0]).unwrap();
    assert_eq!(store.pending(10).unwrap()[0].id, ids[0]);
    for id in ids {
        store.mark_published(id).unwrap();
    }
    assert!(store.is_empty());
}

#[test]
fn registry_versions_and_lookups() {
    let reg = InMemorySchemaRegistry::new();
    let a = reg.register("s", "json-schema", "{}").unwrap();
    assert_eq!(reg.register("s", "json-schema", "{}").unwrap(), a);
    let b = reg.register("s", "json-schema", "{ }").unwrap();
    assert_eq!((a.version, b.version), (1, 2));
    assert_eq!(reg.latest("s").unwrap(), b);
    assert_eq!(reg.by_id(a.id).unwrap(), a);
    assert_eq!(reg.versions("s").unwrap(), vec![a, b]);
    assert!(matches!(reg.latest("t"), Err(Error::SchemaNotFound { .. })));
    assert!(matches!(reg.by_id(99), Err(Error::SchemaNotFound { .. })));
}

#[test]
fn stores_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<InMemoryIdempotencyStore>();
    check::<InMemoryOutboxStore>();
    check::<InMemorySchemaRegistry>();
    #[cfg(feature = "sqlite")]
    {
        check::<acemq_amqp::patterns::idempotency::SqlIdempotencyStore>();
        check::<acemq_amqp::patterns::outbox::SqlOutboxStore>();
        check::<acemq_amqp::patterns::schema_registry::SqlSchemaRegistry>();
    }
    let _: Arc<dyn IdempotencyStore> = Arc::new(InMemoryIdempotencyStore::default());
    let _: Arc<dyn OutboxStore> = Arc::new(InMemoryOutboxStore::default());
    let _: Arc<dyn SchemaRegistry> = Arc::new(InMemorySchemaRegistry::new());
}
