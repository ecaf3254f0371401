//! The family's patterns, one module each.

pub mod acknowledged;
pub mod chain;
pub mod claim_check;
pub mod consumer_group;
pub mod idempotency;
pub mod idempotent;
pub mod ordering;
pub mod outbox;
pub mod peek;
pub mod pipeline;
pub mod replay;
pub mod request_reply;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod retention;
pub mod routing_slip;
pub mod saga;
pub mod scheduler;
pub mod schema_registry;
pub mod streams;
