//! The SQL idempotency store: its statements, the store and its options, the batch helpers
//! the transactional wrappers use, and PostgreSQL's one-statement group.

mod batch;
mod group_statement;
mod retention;
mod statements;
mod store;

pub use store::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
