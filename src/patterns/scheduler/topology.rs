//! The ladder and what a scheduler declares: the family's names, rungs, hop plans, topology.

use std::time::Duration;

use crate::connection::{Binding, Connection, ExchangeSpec, QueueSpec};
use crate::error::Result;

/// The family's scheduler exchange.
pub const SCHEDULE_EXCHANGE: &str = "acemq.schedule";
/// The family's control queue.
pub const SCHEDULE_CONTROL_QUEUE: &str = "acemq.schedule.due";
/// The envelope type of a scheduled message, between rungs and on delivery.
pub const SCHEDULED_MESSAGE_TYPE: &str = "ScheduledMessage";

/// The family's rungs, longest first: 1 h, 10 min, 1 min, 10 s, 1 s.
pub fn schedule_rungs() -> Vec<Duration> {
    [3_600, 600, 60, 10, 1]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

/// A rung's suffix: whole hours `Nh`, whole minutes `Nm`, else seconds `Ns`.
pub(super) fn rung_suffix(rung: Duration) -> String {
    let ms = rung.as_millis();
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1_000)
    }
}

/// The rung that a message with `remaining` left waits on next, or `None` when it is due.
/// `rungs` is longest first. The largest rung that does not overshoot by more than half the
/// smallest rung; due when less than that half is left. The slack absorbs the time the hops
/// themselves take: a 90 s delay really hops `1m, 10s, 10s, 10s` (without it, each hop's few
/// milliseconds would turn the last `10s` into nine `1s` hops), and a delivery lands within half
/// the smallest rung of its due time rather than up to a whole rung early.
pub(super) fn next_rung(rungs: &[Duration], remaining: Duration) -> Option<Duration> {
    let slack = rungs.last().copied().unwrap_or_default() / 2;
    if remaining < slack {
        return None;
    }
    rungs.iter().copied().find(|r| *r <= remaining + slack)
}

/// The rungs a message scheduled `delay` ahead waits on, in order, if the hops took no time of
/// their own. On the family's ladder: 90 s → `[1m, 10s, 10s, 10s]`, 4 h → four `1h`, 400 ms →
/// none (delivered at once).
pub fn hop_plan(delay: Duration) -> Vec<Duration> {
    hop_plan_on(&schedule_rungs(), delay)
}

/// [`hop_plan`] on another ladder (any order).
pub fn hop_plan_on(rungs: &[Duration], delay: Duration) -> Vec<Duration> {
    let mut sorted: Vec<Duration> = rungs.iter().copied().filter(|r| !r.is_zero()).collect();
    sorted.sort_by(|a, b| b.cmp(a));
    let mut plan = Vec::new();
    let mut remaining = delay;
    while let Some(rung) = next_rung(&sorted, remaining) {
        plan.push(rung);
        remaining = remaining.saturating_sub(rung);
    }
    plan
}

/// Everything a scheduler declares: one exchange, the rungs and the control queue, and their
/// bindings.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleTopology {
    /// The scheduler's exchange.
    pub exchange: ExchangeSpec,
    /// The rungs (longest first), then the control queue.
    pub queues: Vec<QueueSpec>,
    /// Each queue bound to the exchange under its own name.
    pub bindings: Vec<Binding>,
}

impl ScheduleTopology {
    /// Declares it all (and remembers it for re-declaration after recovery). Each declaration
    /// runs on a channel of its own, so a conflict leaves the connection usable.
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`](crate::Error::TopologyConflict) when one of the queues exists with other arguments.
    pub fn apply(&self, connection: &Connection) -> Result<()> {
        connection.declare_exchange(&self.exchange)?;
        for q in &self.queues {
            connection.declare_queue(q)?;
        }
        for b in &self.bindings {
            connection.bind(b)?;
        }
        Ok(())
    }
}

/// The family's scheduler topology (see the [module docs](super)).
pub fn schedule_topology() -> ScheduleTopology {
    topology_of(SCHEDULE_EXCHANGE, &schedule_rungs())
}

/// The control queue of a scheduler on `base`: `{base}.due`.
pub(super) fn control_queue_of(base: &str) -> String {
    format!("{base}.due")
}

/// The queue of `rung` on `base`: `{base}.{rung}`.
pub(super) fn rung_queue_of(base: &str, rung: Duration) -> String {
    format!("{base}.{}", rung_suffix(rung))
}

/// What a scheduler on `base` with `rungs` declares.
pub(super) fn topology_of(base: &str, rungs: &[Duration]) -> ScheduleTopology {
    let exchange = ExchangeSpec::direct(base.to_string());
    let mut queues: Vec<QueueSpec> = rungs
        .iter()
        .map(|r| {
            QueueSpec::new(rung_queue_of(base, *r))
                .classic()
                .message_ttl(*r)
                .dead_letter_exchange(base.to_string())
                .dead_letter_routing_key(control_queue_of(base))
        })
        .collect();
    queues.push(QueueSpec::new(control_queue_of(base)).classic());
    let bindings = queues
        .iter()
        .map(|q| {
            Binding::new()
                .queue(q.name())
                .exchange(base.to_string())
                .routing_key(q.name())
        })
        .collect();
    ScheduleTopology {
        exchange,
        queues,
        bindings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rung_names_are_the_familys() {
        let names: Vec<String> = schedule_rungs().into_iter().map(rung_suffix).collect();
        assert_eq!(names, ["1h", "10m", "1m", "10s", "1s"]);
    }

    #[test]
    fn next_rung_is_the_largest_that_does_not_overshoot_by_more_than_half_a_second() {
        let rungs = schedule_rungs();
        let ms = Duration::from_millis;
        assert_eq!(next_rung(&rungs, ms(499)), None);
        assert_eq!(next_rung(&rungs, ms(500)), Some(ms(1_000)));
        assert_eq!(next_rung(&rungs, ms(9_990)), Some(ms(10_000)));
        assert_eq!(next_rung(&rungs, ms(9_400)), Some(ms(1_000)));
        assert_eq!(next_rung(&rungs, ms(59_000)), Some(ms(10_000)));
        assert_eq!(next_rung(&rungs, ms(59_600)), Some(ms(60_000)));
    }

    #[test]
    fn a_90_s_delay_hops_as_planned_even_when_each_hop_takes_time() {
        // Each hop 30 ms late, as a real broker round trip is.
        let rungs = schedule_rungs();
        let mut remaining = Duration::from_secs(90);
        let mut hops = Vec::new();
        while let Some(r) = next_rung(&rungs, remaining) {
            hops.push(rung_suffix(r));
            remaining = remaining.saturating_sub(r + Duration::from_millis(30));
        }
        assert_eq!(hops, ["1m", "10s", "10s", "10s"]);
    }
}
