//! A schema registry: versioned schema definitions per subject, identified by id.
//!
//! # Guarantees
//!
//! - [`fingerprint`] is the lowercase hex SHA-256 of the definition's exact bytes, with no
//!   normalisation (`{"a":1}` and `{ "a": 1 }` are different schemas), as in every AceMQ
//!   library.
//! - [`SchemaRegistry::register`] gives a new definition the subject's next version (1, 2, …)
//!   and a new id; registering the same bytes under the same subject again returns the existing
//!   schema. Concurrent registrations of one definition (threads, processes, hosts sharing the
//!   table) agree on one id and version: the table is unique on `(subject, version)` and on
//!   `(subject, fingerprint)`, and a registration that loses the race re-reads the winner.
//! - Lookups of an unknown id or subject fail with [`Error::SchemaNotFound`](crate::Error::SchemaNotFound).
//!
//! [`InMemorySchemaRegistry`] keeps schemas in one process; it is for tests, **not for
//! production** (ids are not shared between processes and vanish on restart).

mod memory;
mod schema;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;

pub use memory::InMemorySchemaRegistry;
pub use schema::{fingerprint, Schema, SchemaRegistry};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sql::{SqlSchemaRegistry, SqlSchemaRegistryOptions};
