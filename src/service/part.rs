//! [`ServicePart`]: what the service host runs and stops — consumers, responders, relays, the
//! scheduler, or a part of the application's own — and the order it stops them in ([`Stage`]).

use std::time::Duration;

use super::report::PartReport;
use crate::consume::{CloseReport, RunningConsumer};
use crate::error::{Error, Result};
use crate::patterns::consumer_group::RunningConsumerGroup;
use crate::patterns::outbox::RunningRelay;
use crate::patterns::request_reply::RunningResponder;
use crate::patterns::scheduler::RunningScheduler;

/// When a part stops while the service drains: the consumers first (they stop taking
/// deliveries, finish what runs), then the relays (a last sweep of what those handlers wrote
/// to the outbox), then the rest (responders, the scheduler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Consumers and consumer groups.
    Consumers,
    /// Outbox relays.
    Relays,
    /// Responders, the scheduler, and parts of the application's own.
    Last,
}

/// A running piece of a service. Implemented for the crate's running consumers, groups,
/// responders, relays and scheduler; implement it for a part of your own (a thread that polls
/// something) to have the host start, watch, pause and stop it with the rest.
pub trait ServicePart: Send {
    /// When it stops while the service drains.
    fn stage(&self) -> Stage;

    /// Stop taking work without stopping (flow control). Does nothing by default.
    ///
    /// # Errors
    ///
    /// Why it could not pause.
    fn pause(&self) -> Result<()> {
        Ok(())
    }

    /// Take work again after [`pause`](Self::pause). Does nothing by default.
    ///
    /// # Errors
    ///
    /// Why it could not resume.
    fn resume(&self) -> Result<()> {
        Ok(())
    }

    /// Run `concurrency` handlers at once from now on.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] by default: the part has no concurrency.
    fn scale_to(&self, concurrency: usize) -> Result<()> {
        let _ = concurrency;
        Err(Error::invalid("this part of the service cannot be scaled"))
    }

    /// True once it has ended on its own (failed): the host then stops the service.
    fn is_finished(&self) -> bool;

    /// Stops, waiting up to `deadline` for work under way; what it handled, gave back and
    /// abandoned.
    fn stop(self: Box<Self>, deadline: Duration) -> PartReport;
}

fn from_close(result: Result<CloseReport>) -> PartReport {
    match result {
        Ok(r) => PartReport {
            handled: r.handled,
            finished_in_time: r.finished_in_time,
            requeued: r.requeued,
            abandoned: r.abandoned,
            ..PartReport::default()
        },
        Err(e) => PartReport {
            error: Some(e.to_string()),
            ..PartReport::default()
        },
    }
}

impl ServicePart for RunningConsumer {
    fn stage(&self) -> Stage {
        Stage::Consumers
    }

    fn pause(&self) -> Result<()> {
        RunningConsumer::pause(self).map(drop)
    }

    fn resume(&self) -> Result<()> {
        RunningConsumer::resume(self)
    }

    fn scale_to(&self, concurrency: usize) -> Result<()> {
        RunningConsumer::scale_to(self, concurrency)
    }

    fn is_finished(&self) -> bool {
        RunningConsumer::is_finished(self)
    }

    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        from_close(self.drain(deadline))
    }
}

impl ServicePart for RunningResponder {
    fn stage(&self) -> Stage {
        Stage::Last
    }

    fn pause(&self) -> Result<()> {
        RunningResponder::pause(self).map(drop)
    }

    fn resume(&self) -> Result<()> {
        RunningResponder::resume(self)
    }

    fn scale_to(&self, concurrency: usize) -> Result<()> {
        RunningResponder::scale_to(self, concurrency)
    }

    fn is_finished(&self) -> bool {
        RunningResponder::is_finished(self)
    }

    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        from_close(self.drain(deadline))
    }
}

impl ServicePart for RunningScheduler {
    fn stage(&self) -> Stage {
        Stage::Last
    }

    fn is_finished(&self) -> bool {
        RunningScheduler::is_finished(self)
    }

    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        from_close(self.drain(deadline))
    }
}

impl ServicePart for RunningConsumerGroup {
    fn stage(&self) -> Stage {
        Stage::Consumers
    }

    fn is_finished(&self) -> bool {
        false
    }

    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        from_close(self.drain(deadline))
    }
}

impl ServicePart for RunningRelay {
    fn stage(&self) -> Stage {
        Stage::Relays
    }

    /// A relay retries a failed sweep on its own: it never ends by itself.
    fn is_finished(&self) -> bool {
        false
    }

    /// A last sweep (what the stopped consumers' handlers wrote), then the relay closes. With
    /// nothing left of the deadline the sweep is skipped: the records stay in the outbox for the
    /// next process, nothing is lost. A sweep is one batch, its confirms bounded by the relay
    /// publisher's timeout.
    fn stop(self: Box<Self>, deadline: Duration) -> PartReport {
        let last = if deadline.is_zero() {
            Ok(0)
        } else {
            self.sweep()
        };
        let closed = self.close();
        let mut report = PartReport::default();
        match (last, closed) {
            (Ok(_), Ok(r)) => report.handled = r.published,
            (Err(e), _) | (_, Err(e)) => report.error = Some(format!("the last sweep: {e}")),
        }
        report
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl ServicePart for crate::patterns::retention::RunningSweeper {
    fn stage(&self) -> Stage {
        Stage::Last
    }

    /// It logs a failed purge and tries again at its next interval: it never ends by itself.
    fn is_finished(&self) -> bool {
        false
    }

    fn stop(self: Box<Self>, _deadline: Duration) -> PartReport {
        self.close();
        PartReport::default()
    }
}
