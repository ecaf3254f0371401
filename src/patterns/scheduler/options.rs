//! [`SchedulerOptions`]: the base name, the ladder and the control consumer's settings.

use std::time::Duration;

use super::topology::{
    control_queue_of, rung_queue_of, schedule_rungs, topology_of, ScheduleTopology,
    SCHEDULE_EXCHANGE,
};
use crate::consume::ConsumerOptions;
use crate::envelope::check_name;
use crate::error::{Error, Result};

/// The control consumer's prefetch, as in Go and Java.
const CONTROL_PREFETCH: u16 = 50;

/// How a [`Scheduler`](super::Scheduler) runs: given to [`Scheduler::new`](super::Scheduler::new), checked there.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    pub(super) base: String,
    pub(super) rungs: Vec<Duration>,
    pub(super) consumer: ConsumerOptions,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            base: SCHEDULE_EXCHANGE.to_string(),
            rungs: schedule_rungs(),
            consumer: ConsumerOptions::new()
                .prefetch(CONTROL_PREFETCH)
                .concurrency(1)
                .shutdown_timeout(Duration::from_secs(30)),
        }
    }
}

impl SchedulerOptions {
    /// Default options: the family's names and ladder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The base name: the exchange, `{base}.{rung}` the rungs, `{base}.due` the control queue.
    /// Only the default is shared with other libraries. Defaults to `acemq.schedule`.
    pub fn base(mut self, base: impl Into<String>) -> Self {
        self.base = base.into();
        self
    }

    /// The rungs (each a whole number of seconds, at least 1 s). Defaults to 1 h, 10 min,
    /// 1 min, 10 s, 1 s.
    pub fn rungs(mut self, rungs: impl IntoIterator<Item = Duration>) -> Self {
        let mut rungs: Vec<Duration> = rungs.into_iter().collect();
        rungs.sort_by(|a, b| b.cmp(a));
        rungs.dedup();
        self.rungs = rungs;
        self
    }

    /// The control consumer's settings (prefetch, worker threads moving control messages, how
    /// long closing waits for a hop under way, …); the scheduler turns off their `declare` and
    /// their attempt limit (it handles every attempt). Defaults to prefetch 50 (as in Go and
    /// Java), concurrency 1 and a 30 s shutdown timeout.
    pub fn consumer(mut self, consumer: ConsumerOptions) -> Self {
        self.consumer = consumer;
        self
    }

    pub(super) fn control_queue(&self) -> String {
        control_queue_of(&self.base)
    }

    pub(super) fn rung_queue(&self, rung: Duration) -> String {
        rung_queue_of(&self.base, rung)
    }

    pub(super) fn validate(&self) -> Result<()> {
        check_name("exchange", &self.base, false)?;
        check_name("queue", &self.control_queue(), false)?;
        if self.rungs.is_empty() {
            return Err(Error::invalid("a scheduler needs at least one rung"));
        }
        for r in &self.rungs {
            if r.as_secs() == 0 || r.subsec_nanos() != 0 {
                return Err(Error::invalid(format!(
                    "scheduler rung {r:?}: rungs are whole seconds, at least 1 s"
                )));
            }
            check_name("queue", &self.rung_queue(*r), false)?;
        }
        self.consumer.validate(&self.control_queue())
    }

    /// What a scheduler with these options declares.
    pub fn topology(&self) -> ScheduleTopology {
        topology_of(&self.base, &self.rungs)
    }
}
