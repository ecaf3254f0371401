//! The family's patterns, one module each.

pub mod acknowledged;
pub mod chain;
pub mod consumer_group;
pub mod idempotency;
pub mod idempotent;
pub mod ordering;
pub mod outbox;
pub mod pipeline;
pub mod relay;
pub mod request_reply;
pub mod schema_registry;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::sql::{create_schema, schema_ddl};
pub use chain::{
    chain, with_idempotency, with_logging, with_ordering, with_timeout, BoxHandler, Chain,
    Deadline, Layer, Logged, OrphanCount, TimeLimited,
};
pub use consumer_group::ConsumerGroup;
pub use idempotency::{Claim, ClaimToken, IdempotencyStore, InMemoryIdempotencyStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreBuilder};
pub use idempotent::{idempotent, DuplicateCount, Idempotent};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idempotent::{idempotent_tx, IdempotentTx};
pub use ordering::{
    by_correlation, by_header, ordered, partition, partitioned_routing_key, Ordered,
};
pub use outbox::{InMemoryOutboxStore, NewOutboxRecord, OutboxRecord, OutboxStats, OutboxStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use outbox::{SqlOutboxStore, SqlOutboxStoreBuilder};
pub use pipeline::{then, Next, Then, NOTHING};
pub use relay::{
    record, record_message, OutboxRelay, OutboxRelayOptions, RelayReport, RunningRelay,
};
pub use request_reply::{serve, serve_with, Requester, RequesterOptions, Responder};
pub use schema_registry::{fingerprint, InMemorySchemaRegistry, Schema, SchemaRegistry};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use schema_registry::{SqlSchemaRegistry, SqlSchemaRegistryBuilder};
