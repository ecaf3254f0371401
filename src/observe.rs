//! Observability: an [`Observer`] receives what the engine does; [`LogObserver`], the default,
//! writes it through the `log` crate. Payloads are never passed to an observer or logged.
//!
//! The family's metric names and label keys are the constants in [`metrics`]; an observer that
//! feeds a metrics system should use them with the labels and values named there. With the `metrics` feature,
//! `MetricsObserver` does exactly that through the `metrics` crate facade (its docs list every
//! name, kind and label it records).

pub(crate) mod batch_report;
mod events;
pub mod metrics;
#[cfg(feature = "metrics")]
mod metrics_observer;
mod observer;
pub(crate) mod replay_report;

pub use events::{
    ConnectionEvent, Decision, Duplicate, IdReplaced, InFlight, OutboxEvent, Overrun,
    PipelineOutcome, PipelineRun, PublishEvent, PublishOutcome, Received, ReplayEvent,
    RequestEvent, RequestOutcome, Retried, RetryWhere, RungMissing, SetAsideFailed, Settlement,
};
// The names `MetricsObserver` alone used to define, at their old paths (one documented path
// per item: `observe::metrics`).
#[cfg(feature = "metrics")]
#[doc(hidden)]
pub use metrics::{
    CONSUME_DURATION, DEAD_LETTERED_TOTAL, OUTBOX_OLDEST_AGE, OUTBOX_PENDING, REQUEST_TOTAL,
    RETRIED_TOTAL,
};
#[cfg(feature = "metrics")]
pub use metrics_observer::MetricsObserver;
pub(crate) use observer::Guarded;
pub use observer::{LogObserver, Observer};
