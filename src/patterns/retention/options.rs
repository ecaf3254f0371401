//! [`RetentionOptions`]: how old a receipt may be deleted at, and where the messages that
//! could still be delivered again wait.

use std::time::Duration;

use crate::consume::RetryPolicy;
use crate::error::{Error, Result};
use crate::names::{dead_letter_queue, parked_queue, retry_queue};
use crate::patterns::peek::PEEK_MAX;
use crate::patterns::scheduler::SchedulerOptions;

/// What a purge may delete and what it must look at first.
#[derive(Clone, Debug)]
pub struct RetentionOptions {
    pub(super) older_than: Duration,
    pub(super) queues: Vec<String>,
    pub(super) scan_limit: usize,
    pub(super) retired_outbox: bool,
}

impl RetentionOptions {
    /// Receipts (and, with [`retired_outbox`](Self::retired_outbox), retired outbox records)
    /// older than `older_than` may go — unless a message still waiting is older (the guard).
    pub fn new(older_than: Duration) -> RetentionOptions {
        RetentionOptions {
            older_than,
            queues: Vec::new(),
            scan_limit: PEEK_MAX,
            retired_outbox: false,
        }
    }

    /// A queue whose consumer keeps its receipts in the store: the queue, its `.dlq`, its
    /// `.parked` and the retry rungs `policy` waits in on the broker are scanned.
    pub fn consumed_queue(mut self, queue: &str, policy: &RetryPolicy) -> RetentionOptions {
        self.queues.push(queue.to_string());
        self.queues.push(dead_letter_queue(queue));
        self.queues.push(parked_queue(queue));
        for rung in policy.broker_rungs() {
            self.queues.push(retry_queue(queue, rung));
        }
        self
    }

    /// Another queue where such messages wait (a queue a replay sends to, say).
    pub fn queue(mut self, queue: &str) -> RetentionOptions {
        self.queues.push(queue.to_string());
        self
    }

    /// The scheduler's ladder: its rungs and control queue are scanned (a message scheduled
    /// for later is delivered later).
    pub fn scheduler(mut self, options: &SchedulerOptions) -> RetentionOptions {
        for q in options.topology().queues {
            self.queues.push(q.name().to_string());
        }
        self
    }

    /// The most messages one queue may hold for its scan (default and at most 10,000): past
    /// it the horizon cannot be known and nothing is purged.
    pub fn scan_limit(mut self, limit: usize) -> RetentionOptions {
        self.scan_limit = limit;
        self
    }

    /// Also deletes retired outbox records older than the retention (off by default: a
    /// retired record is a message given up on, which an operator may still release).
    pub fn retired_outbox(mut self, on: bool) -> RetentionOptions {
        self.retired_outbox = on;
        self
    }

    pub(super) fn queues_to_scan(&self) -> Vec<String> {
        let mut seen = Vec::with_capacity(self.queues.len());
        for q in &self.queues {
            if !seen.contains(q) {
                seen.push(q.clone());
            }
        }
        seen
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.queues.is_empty() {
            return Err(Error::invalid(
                "a purge needs the queues whose messages may still be delivered again \
                 (consumed_queue, queue, scheduler): without them nothing guards the receipts",
            ));
        }
        if self.scan_limit == 0 || self.scan_limit > PEEK_MAX {
            return Err(Error::invalid(format!(
                "the scan limit is from 1 to {PEEK_MAX}, not {}",
                self.scan_limit
            )));
        }
        Ok(())
    }
}
