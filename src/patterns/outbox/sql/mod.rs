//! The outbox on SQLite, PostgreSQL or MySQL.

mod mysql;
mod retention;
mod row;
mod statements;
mod store;

#[cfg(feature = "internals")]
pub(crate) use row::record;
pub use store::{SqlOutboxStore, SqlOutboxStoreOptions};
