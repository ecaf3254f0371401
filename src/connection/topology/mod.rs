//! Exchanges, queues and bindings: declared at once, remembered, and re-declared after every
//! recovery in the order exchanges, queues, bindings.
//!
//! Each operation runs on a short-lived channel of its own, so a refused declaration (the broker
//! closes the channel with 406 or 404) never disturbs publishers or consumers, and the
//! connection keeps working.

mod admin;
mod calls;
mod compare;
mod declare;
mod remembered;
mod spec;

pub(crate) use calls::declare_queue_on;
pub use compare::TopologyDifference;
pub(crate) use remembered::{redeclare, Topology};
pub(crate) use spec::to_table;
pub use spec::{
    Binding, ExchangeKind, ExchangeSpec, QueueInfo, QueueKind, QueueSpec, StreamRetention,
};
