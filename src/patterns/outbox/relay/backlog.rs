//! The backlog gauge: how many records wait and how old the oldest is, reported to the
//! observer after a sweep that found less than a full batch and, while the relay works through
//! a backlog, at most every second — never at more than a small share of the relay's time.

use std::time::{Duration, Instant};

use super::state::Core;
use crate::envelope::now_ms;
use crate::observe::OutboxEvent;

/// How often a relay working through full batches reports the backlog.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// A backlog count is asked again only this many times its last duration after it started: the
/// count (`COUNT(*)` over the table's rows not retired) takes long on a large table, and the
/// gauge may then cost the relay at most ~5 % of its time.
const BACKLOG_COST_FACTOR: u32 = 20;

/// When the last backlog count started, and how long it took.
pub(super) struct Backlog {
    reported: Instant,
    count_took: Duration,
}

impl Backlog {
    pub(super) fn new() -> Backlog {
        Backlog {
            reported: Instant::now(),
            count_took: Duration::ZERO,
        }
    }

    /// After a sweep (`full`: it found a full batch): reports the backlog if it is due.
    pub(super) fn after_sweep(&mut self, core: &Core, full: bool) {
        // After a sweep that found less than a full batch, and while working through a backlog
        // at most every `BACKLOG_EVERY` (its query counts the table: not a cost to pay per
        // batch); in either case not before `BACKLOG_COST_FACTOR` times the last count's
        // duration.
        let since = self.reported.elapsed();
        let due = !full || since >= core.options.interval.max(BACKLOG_EVERY);
        if due && since >= self.count_took * BACKLOG_COST_FACTOR {
            self.reported = Instant::now();
            core.report_backlog();
            self.count_took = self.reported.elapsed();
        }
    }
}

impl Core {
    fn report_backlog(&self) {
        match self.store.stats() {
            Ok(stats) => {
                let oldest_age = stats.oldest_created_ms.map(|c| {
                    Duration::from_millis(u64::try_from(now_ms().saturating_sub(c)).unwrap_or(0))
                });
                self.health.lock().backlog = Some((stats.pending, oldest_age, Instant::now()));
                self.observer.outbox(&OutboxEvent::Backlog {
                    pending: stats.pending,
                    oldest_age,
                });
            }
            Err(e) => log::warn!("acemq: reading the outbox backlog: {e}"),
        }
    }
}
