//! The family's patterns, one module each.

pub mod acknowledged;
mod idempotency;
mod outbox;
mod schema_registry;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::sql::{create_schema, schema_ddl};
pub use idempotency::{Claim, IdempotencyStore, InMemoryIdempotencyStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreBuilder};
pub use outbox::{InMemoryOutboxStore, NewOutboxRecord, OutboxRecord, OutboxStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use outbox::{SqlOutboxStore, SqlOutboxStoreBuilder};
pub use schema_registry::{fingerprint, InMemorySchemaRegistry, Schema, SchemaRegistry};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use schema_registry::{SqlSchemaRegistry, SqlSchemaRegistryBuilder};
