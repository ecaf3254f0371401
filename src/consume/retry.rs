//! The retry ladder: attempts, delays, and the queues that hold a message while it waits.
//!
//! A retry is a copy published to `{queue}.retry.{rung}`, a durable classic queue whose
//! `x-message-ttl` is the rung's delay and which dead-letters back to `{queue}` through the
//! default exchange. Attempts are counted in `x-acemq-attempt`, never from `x-death`.

use std::time::Duration;

use crate::connection::{Connection, QueueSpec};
use crate::error::{Error, Result};

/// How many times a message is tried and how long it waits between tries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    delays: Vec<Duration>,
}

impl Default for RetryPolicy {
    /// Five attempts, waiting 1 s, 10 s, 1 min and 10 min between them.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(10),
                Duration::from_secs(60),
                Duration::from_secs(600),
            ],
        }
    }
}

impl RetryPolicy {
    /// A custom ladder: attempt `n` (from 1) that fails waits `delays[n-1]` (the last delay
    /// again when the ladder is shorter). `max_attempts` defaults to one more than the number of
    /// delays.
    pub fn ladder(delays: impl IntoIterator<Item = Duration>) -> Self {
        let delays: Vec<Duration> = delays.into_iter().collect();
        RetryPolicy {
            max_attempts: u32::try_from(delays.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            delays,
        }
    }

    /// No retries: the first failure goes to `{queue}.dlq`.
    pub fn no_retry() -> Self {
        RetryPolicy {
            max_attempts: 1,
            delays: Vec::new(),
        }
    }

    /// Sets the number of attempts in all (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The number of attempts in all.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delays of the ladder.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts must be at least 1"));
        }
        if self.max_attempts > 1 && self.delays.is_empty() {
            return Err(Error::invalid(
                "a retry policy with retries needs at least one delay",
            ));
        }
        if let Some(d) = self.delays.iter().find(|d| d.as_millis() == 0) {
            return Err(Error::invalid(format!("retry delay {d:?} is under 1 ms")));
        }
        Ok(())
    }

    /// The delay after failed attempt `attempt` (from 1), or `None` when it was the last.
    pub(crate) fn delay_after(&self, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        let i = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
        self.delays.get(i).or(self.delays.last()).copied()
    }
}

/// The rung name of a delay: `1s`, `10s`, `1m`, `10m`, `1h`, or milliseconds (`250ms`).
pub fn rung_name(delay: Duration) -> String {
    let ms = delay.as_millis();
    if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms > 0 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `{queue}.retry.{rung}`.
pub fn retry_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}", rung_name(delay))
}

/// `{queue}.dlq`.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// `{queue}.parked`.
pub fn parked_queue(queue: &str) -> String {
    format!("{queue}.parked")
}

/// The declaration of one retry rung.
pub(crate) fn rung_spec(queue: &str, delay: Duration) -> QueueSpec {
    QueueSpec::new(retry_queue(queue, delay))
        .message_ttl(delay)
        .dead_letter_exchange("")
        .dead_letter_routing_key(queue)
}

/// Declares the retry rungs, `.dlq` and `.parked` of `queue` (remembered for recovery).
pub(crate) fn declare_ladder(
    connection: &Connection,
    queue: &str,
    policy: &RetryPolicy,
) -> Result<()> {
    let mut seen = Vec::new();
    for d in policy.delays() {
        if !seen.contains(d) {
            connection.declare_queue(&rung_spec(queue, *d))?;
            seen.push(*d);
        }
    }
    connection.declare_queue(&QueueSpec::new(dead_letter_queue(queue)))?;
    connection.declare_queue(&QueueSpec::new(parked_queue(queue)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ladder() {
        let p = RetryPolicy::default();
        let names: Vec<_> = (1..=5)
            .map(|a| p.delay_after(a).map(|d| retry_queue("orders", d)))
            .collect();
        assert_eq!(
            names,
            vec![
                Some("orders.retry.1s".to_string()),
                Some("orders.retry.10s".to_string()),
                Some("orders.retry.1m".to_string()),
                Some("orders.retry.10m".to_string()),
                None
            ]
        );
        assert_eq!(RetryPolicy::no_retry().delay_after(1), None);
        assert_eq!(rung_name(Duration::from_millis(250)), "250ms");
        assert_eq!(rung_name(Duration::from_secs(3600)), "1h");
    }

    #[test]
    fn validation() {
        assert!(RetryPolicy::default().max_attempts(0).validate().is_err());
        assert!(RetryPolicy::ladder([]).max_attempts(3).validate().is_err());
        assert!(RetryPolicy::no_retry().validate().is_ok());
        let short = RetryPolicy::ladder([Duration::from_millis(100)]).max_attempts(4);
        assert_eq!(short.delay_after(3), Some(Duration::from_millis(100)));
        assert_eq!(short.delay_after(4), None);
    }
}
