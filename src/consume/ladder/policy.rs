//! The family's retry policy and the topology a failed message travels through.
//!
//! The arithmetic is the AceMQ family's (Python `retry.py`, Java `RetryPolicy`): the wait before
//! attempt `n + 1` is `min(initial × multiplierⁿ⁻¹, max_delay)`. A wait shorter than the
//! broker-wait threshold (30 s by default) is spent in the consumer, jittered, holding the
//! delivery (not a worker thread: see `timer.rs`), and the copy then goes back to the queue
//! itself; a longer wait is spent on a **rung**: `{queue}.retry.{Ns|Nm|Nh}`, a durable classic
//! queue whose `x-message-ttl` is the wait and which dead-letters through the `acemq.retry`
//! exchange back to the queue (bound there on its own name). Messages that give up go to
//! `{queue}.dlq`, set-aside ones to `{queue}.parked`, both bound to `acemq.dlx` on their own
//! names. Attempts are counted in `x-acemq-attempt`, never from `x-death`.

use std::time::Duration;

use crate::connection::{Binding, Connection, ExchangeSpec, QueueSpec};
use crate::envelope::HeaderValue;
use crate::error::{Error, Result};
use crate::names::{
    dead_letter_queue, parked_queue, retry_queue, DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE,
};

/// Waits at least this long go to a broker rung; shorter ones are spent in the consumer.
pub const DEFAULT_BROKER_WAIT_THRESHOLD: Duration = Duration::from_secs(30);

/// How many times a message is tried, how long it waits between tries, and where it waits: the
/// AceMQ family's policy arithmetic.
///
/// ```
/// use acemq_amqp::RetryPolicy;
/// use std::time::Duration;
/// // 6 attempts; waits of 10 s and 20 s in the consumer, then 40 s, 80 s and 160 s on rungs.
/// let policy = RetryPolicy::exponential()
///     .max_attempts(6)
///     .initial_delay(Duration::from_secs(10))
///     .max_delay(Duration::from_secs(300));
/// assert_eq!(policy.schedule().len(), 5);
/// assert_eq!(policy.broker_rungs(), vec![
///     Duration::from_secs(40), Duration::from_secs(80), Duration::from_secs(160),
/// ]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_delay: Duration,
    multiplier: f64,
    max_delay: Option<Duration>,
    jitter: f64,
    max_message_age: Option<Duration>,
    broker_wait_threshold: Duration,
    quorum_rungs: bool,
}

impl Default for RetryPolicy {
    /// No retries ([`RetryPolicy::none`]), as in the family: the first failure goes to
    /// `{queue}.dlq`. Choose a policy to retry.
    fn default() -> Self {
        RetryPolicy::none()
    }
}

impl RetryPolicy {
    /// One attempt: the first failure goes to `{queue}.dlq`.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            initial_delay: Duration::ZERO,
            multiplier: 2.0,
            max_delay: None,
            jitter: 0.0,
            max_message_age: None,
            broker_wait_threshold: DEFAULT_BROKER_WAIT_THRESHOLD,
            quorum_rungs: false,
        }
    }

    /// The family's exponential policy: [`max_attempts`](Self::max_attempts) in all, waiting
    /// [`initial_delay`](Self::initial_delay) before the second, doubling each time up to
    /// [`max_delay`](Self::max_delay), with ±20 % jitter on waits spent in the consumer (the
    /// family's `exponential(n, initial, max)`). Defaults to 3 attempts, an initial delay of
    /// 1 s and a longest wait of 60 s: set the three.
    pub fn exponential() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Some(Duration::from_secs(60)),
            jitter: 0.2,
            ..RetryPolicy::none()
        }
    }

    /// `max_attempts` in all, waiting `delay` between them, without jitter.
    pub fn fixed(max_attempts: u32, delay: Duration) -> Self {
        RetryPolicy {
            max_attempts,
            initial_delay: delay,
            multiplier: 1.0,
            max_delay: None,
            jitter: 0.0,
            ..RetryPolicy::none()
        }
    }

    /// Sets the number of attempts in all (at least 1: 0 is refused when the consumer is made).
    /// Defaults to 1 for [`none`](Self::none) and 3 for [`exponential`](Self::exponential).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Sets the wait before the second attempt. Defaults to 1 s for
    /// [`exponential`](Self::exponential) (for [`fixed`](Self::fixed), its delay).
    #[must_use]
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// Sets the factor each wait grows by (at least 1). Defaults to 2 for
    /// [`exponential`](Self::exponential), 1 for [`fixed`](Self::fixed).
    #[must_use]
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// Sets the jitter factor (0 to 1): a wait spent in the consumer is multiplied by a uniform
    /// random factor in `[1 - jitter, 1 + jitter)`. Broker waits are never jittered (a rung has
    /// one TTL). Defaults to 0.2 for [`exponential`](Self::exponential), 0 for
    /// [`fixed`](Self::fixed).
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the longest wait. Defaults to 60 s for [`exponential`](Self::exponential), no cap
    /// for [`fixed`](Self::fixed).
    #[must_use]
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.max_delay = Some(max);
        self
    }

    /// Sets the age (since `x-acemq-first-seen`) past which a failing message is not retried but
    /// dead-lettered. Defaults to no limit.
    #[must_use]
    pub fn max_message_age(mut self, age: Duration) -> Self {
        self.max_message_age = Some(age).filter(|a| !a.is_zero());
        self
    }

    /// Sets the shortest wait spent on a broker rung; shorter waits are spent in the consumer.
    /// Defaults to 30 s.
    #[must_use]
    pub fn broker_wait_threshold(mut self, threshold: Duration) -> Self {
        self.broker_wait_threshold = threshold;
        self
    }

    /// Opt-in, **not the family's topology**: declares the broker rungs as quorum queues with
    /// `x-dead-letter-strategy: at-least-once` (which RabbitMQ accepts only with
    /// `x-overflow: reject-publish`, so both are sent) instead of the family's classic rungs.
    ///
    /// Why: dead-lettering out of a classic queue is at-most-once — a broker node lost while
    /// it dead-letters an expired message can drop it — and a classic rung lives on one node,
    /// so losing that node loses every message waiting on it. A quorum rung is replicated and
    /// dead-letters at least once, so a message waiting out a retry survives the loss of a
    /// node of a cluster. The cost: the rung's declaration differs from the one every other
    /// AceMQ library makes, so a Java, Go, Python, .NET or Ruby consumer of the same queue (or
    /// a Rust one without this setting) conflicts with it (`406 PRECONDITION_FAILED`,
    /// [`Error::TopologyConflict`](crate::Error::TopologyConflict)); use it only where every
    /// consumer of the queue sets it, and delete the classic rungs before switching. Needs
    /// RabbitMQ 3.10 or later. The scheduler's rungs are not affected (that topology is
    /// shared). Defaults to `false`.
    #[must_use]
    pub fn quorum_rungs(mut self, quorum: bool) -> Self {
        self.quorum_rungs = quorum;
        self
    }

    /// True when rungs are declared as quorum queues ([`quorum_rungs`](Self::quorum_rungs)).
    pub fn uses_quorum_rungs(&self) -> bool {
        self.quorum_rungs
    }

    /// The number of attempts in all.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The age limit, if any.
    pub fn message_age_limit(&self) -> Option<Duration> {
        self.max_message_age
    }

    /// The broker-wait threshold.
    pub fn threshold(&self) -> Duration {
        self.broker_wait_threshold
    }

    /// The waits before attempts 2 to `max_attempts`, without jitter.
    pub fn schedule(&self) -> Vec<Duration> {
        (1..self.max_attempts).map(|a| self.base_delay(a)).collect()
    }

    /// The distinct waits of the schedule spent on broker rungs, in schedule order.
    pub fn broker_rungs(&self) -> Vec<Duration> {
        let mut rungs: Vec<Duration> = Vec::new();
        for d in self.schedule() {
            if self.waits_in_broker(d) && !rungs.contains(&d) {
                rungs.push(d);
            }
        }
        rungs
    }

    /// True when a wait of `delay` is spent on a broker rung.
    pub fn waits_in_broker(&self, delay: Duration) -> bool {
        !self.broker_wait_threshold.is_zero()
            && !delay.is_zero()
            && delay >= self.broker_wait_threshold
    }

    /// The rung a wanted broker wait goes to: the smallest rung at least as long, else the
    /// longest (the Java and Go rule); `None` when the policy has no rungs.
    pub fn rung_for(&self, delay: Duration) -> Option<Duration> {
        let rungs = self.broker_rungs();
        let mut at_least: Vec<&Duration> = rungs.iter().filter(|r| **r >= delay).collect();
        at_least.sort();
        at_least
            .first()
            .map(|d| **d)
            .or_else(|| rungs.iter().max().copied())
    }

    /// The wait before attempt `attempt + 1`, unjittered.
    fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        let mut d = if secs.is_finite() && secs < 1.0e12 {
            // Whole milliseconds, as the Java library computes them.
            Duration::from_millis((secs * 1000.0) as u64)
        } else {
            Duration::from_secs(1_000_000_000_000)
        };
        if let Some(max) = self.max_delay {
            d = d.min(max);
        }
        d
    }

    /// What happens after failed attempt `attempt` of a message `age` old: the wait before the
    /// next one (unjittered), or why not.
    pub(crate) fn next_wait(&self, attempt: u32, age: Duration) -> NextWait {
        if let Some(limit) = self.max_message_age {
            if age >= limit {
                return NextWait::TooOld(limit);
            }
        }
        if attempt >= self.max_attempts {
            return NextWait::Exhausted;
        }
        NextWait::Wait(self.base_delay(attempt))
    }

    /// `delay` with the policy's jitter applied (consumer-side waits only).
    pub(crate) fn jittered(&self, delay: Duration) -> Duration {
        if self.jitter <= 0.0 || delay.is_zero() {
            return delay;
        }
        let unit = (crate::envelope::random_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + (unit * 2.0 - 1.0) * self.jitter;
        delay.mul_f64(factor.max(0.0))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::invalid(
                "the retry policy's max_attempts must be at least 1, not 0",
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(Error::invalid(format!(
                "the retry multiplier must be at least 1, not {}",
                self.multiplier
            )));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::invalid(format!(
                "the retry jitter must be between 0 and 1, not {}",
                self.jitter
            )));
        }
        Ok(())
    }
}

/// What the policy says after a failed attempt.
#[derive(Debug, PartialEq)]
pub(crate) enum NextWait {
    /// Try again after this long.
    Wait(Duration),
    /// That was the last attempt.
    Exhausted,
    /// The message is older than the policy's age limit.
    TooOld(Duration),
}

/// The declaration of one rung: durable, classic, exactly three arguments (the family's); or,
/// with `quorum` ([`RetryPolicy::quorum_rungs`]), a quorum queue with the same three and
/// `x-dead-letter-strategy: at-least-once`, `x-overflow: reject-publish`.
pub(crate) fn rung_spec(queue: &str, delay: Duration, quorum: bool) -> QueueSpec {
    let spec = QueueSpec::new(retry_queue(queue, delay));
    let spec = if quorum {
        spec.quorum()
            .argument(
                "x-dead-letter-strategy",
                HeaderValue::Text("at-least-once".into()),
            )
            .argument("x-overflow", HeaderValue::Text("reject-publish".into()))
    } else {
        spec.classic()
    };
    spec.argument(
        "x-message-ttl",
        HeaderValue::Int(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
    )
    .dead_letter_exchange(RETRY_EXCHANGE)
    .dead_letter_routing_key(queue)
}

/// Declares a rung and the binding that brings its messages home (remembered for recovery).
pub(crate) fn declare_rung(
    connection: &Connection,
    queue: &str,
    delay: Duration,
    quorum: bool,
) -> Result<()> {
    connection.declare_exchange(&ExchangeSpec::direct(RETRY_EXCHANGE))?;
    connection.declare_queue(&rung_spec(queue, delay, quorum))?;
    connection.bind(
        &Binding::new()
            .queue(queue)
            .exchange(RETRY_EXCHANGE)
            .routing_key(queue),
    )
}

/// Everything a consumer of one queue declares for its failures (see [`failure_topology`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FailureTopology {
    /// `acemq.dlx`, then `acemq.retry` when there are rungs.
    pub exchanges: Vec<ExchangeSpec>,
    /// `{queue}.dlq`, `{queue}.parked`, then the rungs in order.
    pub queues: Vec<QueueSpec>,
    /// `.dlq` and `.parked` to `acemq.dlx` on their own names; with rungs, the queue to
    /// `acemq.retry` on its own name.
    pub bindings: Vec<Binding>,
}

/// Where `queue`'s failures go, as the family's consumers declare it (the queue itself is not
/// part of it): `acemq.dlx` with `{queue}.dlq` and `{queue}.parked` (durable, classic, no
/// arguments) bound on their own names; for each of `rungs` (a policy's
/// [`broker_rungs`](RetryPolicy::broker_rungs)) the rung queue `{queue}.retry.{d}` (durable,
/// classic, exactly `x-message-ttl`, `x-dead-letter-exchange: acemq.retry`,
/// `x-dead-letter-routing-key: {queue}`) and, with any rung, `acemq.retry` and the queue bound
/// to it on its own name. A consumer declares exactly this when it starts.
pub fn failure_topology(queue: &str, rungs: &[Duration]) -> FailureTopology {
    let mut t = FailureTopology {
        exchanges: vec![ExchangeSpec::direct(DEAD_LETTER_EXCHANGE)],
        queues: Vec::new(),
        bindings: Vec::new(),
    };
    for name in [dead_letter_queue(queue), parked_queue(queue)] {
        t.queues.push(QueueSpec::new(name.clone()).classic());
        t.bindings.push(
            Binding::new()
                .queue(name.clone())
                .exchange(DEAD_LETTER_EXCHANGE)
                .routing_key(name),
        );
    }
    if !rungs.is_empty() {
        t.exchanges.push(ExchangeSpec::direct(RETRY_EXCHANGE));
        for rung in rungs {
            t.queues.push(rung_spec(queue, *rung, false));
        }
        t.bindings.push(
            Binding::new()
                .queue(queue)
                .exchange(RETRY_EXCHANGE)
                .routing_key(queue),
        );
    }
    t
}

/// Declares where `queue`'s failures go, as the family's consumers do (the queue itself is not
/// declared): [`failure_topology`] for the policy's broker rungs, exchanges first, each rung
/// followed by the binding that brings its messages home.
pub(crate) fn declare_failure_topology(
    connection: &Connection,
    queue: &str,
    policy: &RetryPolicy,
) -> Result<()> {
    connection.declare_exchange(&ExchangeSpec::direct(DEAD_LETTER_EXCHANGE))?;
    for name in [dead_letter_queue(queue), parked_queue(queue)] {
        connection.declare_queue(&QueueSpec::new(name.clone()).classic())?;
        connection.bind(
            &Binding::new()
                .queue(name.clone())
                .exchange(DEAD_LETTER_EXCHANGE)
                .routing_key(name.clone()),
        )?;
    }
    for rung in policy.broker_rungs() {
        declare_rung(connection, queue, rung, policy.quorum_rungs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::rung_name;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn policy_arithmetic_matches_the_family() {
        let p = RetryPolicy::exponential()
            .max_attempts(5)
            .initial_delay(S(1))
            .max_delay(S(60));
        assert_eq!(p.schedule(), vec![S(1), S(2), S(4), S(8)]);
        assert!(p.broker_rungs().is_empty());
        let p = RetryPolicy::exponential()
            .max_attempts(6)
            .initial_delay(S(10))
            .max_delay(S(300));
        assert_eq!(p.broker_rungs(), vec![S(40), S(80), S(160)]);
        let p = RetryPolicy::fixed(4, S(60));
        assert_eq!(p.schedule(), vec![S(60), S(60), S(60)]);
        assert_eq!(p.broker_rungs(), vec![S(60)]);
        assert!(RetryPolicy::none().schedule().is_empty());
        assert_eq!(RetryPolicy::default(), RetryPolicy::none());
    }

    #[test]
    fn next_wait_exhausts_and_ages() {
        let p = RetryPolicy::fixed(3, S(5)).max_message_age(S(60));
        assert_eq!(p.next_wait(1, S(0)), NextWait::Wait(S(5)));
        assert_eq!(p.next_wait(3, S(0)), NextWait::Exhausted);
        assert_eq!(p.next_wait(1, S(61)), NextWait::TooOld(S(60)));
    }

    #[test]
    fn rung_choice_and_names() {
        let p = RetryPolicy::exponential()
            .max_attempts(6)
            .initial_delay(S(10))
            .max_delay(S(300));
        assert_eq!(p.rung_for(S(50)), Some(S(80)));
        assert_eq!(p.rung_for(S(1000)), Some(S(160)));
        assert_eq!(RetryPolicy::none().rung_for(S(50)), None);
        assert_eq!(rung_name(Duration::from_millis(38_400)), "38s");
        assert_eq!(rung_name(Duration::from_millis(500)), "0s");
        assert_eq!(rung_name(S(7200)), "2h");
    }

    #[test]
    fn jitter_stays_in_its_band() {
        let p = RetryPolicy::exponential()
            .max_attempts(3)
            .initial_delay(S(10))
            .max_delay(S(60));
        for _ in 0..1000 {
            let d = p.jittered(S(10));
            assert!(d >= S(8) && d < S(12), "{d:?}");
        }
        assert_eq!(RetryPolicy::fixed(3, S(10)).jittered(S(10)), S(10));
    }

    #[test]
    fn rungs_are_classic_unless_quorum_is_chosen() {
        use crate::connection::QueueKind;
        let classic = rung_spec("q", S(60), false);
        assert_eq!(classic.kind(), QueueKind::Classic);
        assert_eq!(classic.arguments.len(), 3, "the family's three arguments");
        let quorum = rung_spec("q", S(60), true);
        assert_eq!(quorum.kind(), QueueKind::Quorum);
        assert_eq!(
            quorum.arguments.get("x-dead-letter-strategy"),
            Some(&HeaderValue::Text("at-least-once".into()))
        );
        assert_eq!(
            quorum.arguments.get("x-overflow"),
            Some(&HeaderValue::Text("reject-publish".into()))
        );
        assert!(!RetryPolicy::fixed(3, S(60)).uses_quorum_rungs());
        assert!(RetryPolicy::fixed(3, S(60))
            .quorum_rungs(true)
            .uses_quorum_rungs());
    }

    #[test]
    fn failure_topology_is_what_a_consumer_declares() {
        let t = failure_topology("orders", &[S(40), S(80)]);
        let names: Vec<&str> = t.queues.iter().map(|q| q.name()).collect();
        assert_eq!(
            names,
            [
                "orders.dlq",
                "orders.parked",
                "orders.retry.40s",
                "orders.retry.80s"
            ]
        );
        assert_eq!(t.queues[2], rung_spec("orders", S(40), false));
        assert_eq!(t.exchanges.len(), 2);
        assert_eq!(t.bindings.len(), 3);
        let none = failure_topology("orders", &[]);
        assert_eq!((none.exchanges.len(), none.queues.len()), (1, 2));
    }

    #[test]
    fn validation() {
        assert!(RetryPolicy::fixed(0, S(1)).validate().is_err());
        assert!(RetryPolicy::fixed(3, S(1))
            .multiplier(0.5)
            .validate()
            .is_err());
        assert!(RetryPolicy::fixed(3, S(1)).jitter(1.5).validate().is_err());
        assert!(RetryPolicy::none().validate().is_ok());
        let zero = RetryPolicy::exponential().max_attempts(0).validate();
        assert!(
            matches!(&zero, Err(Error::InvalidArgument { reason })
                if reason.contains("max_attempts") && reason.contains("not 0")),
            "{zero:?}"
        );
    }

    #[test]
    fn exponential_is_set_by_name() {
        let p = RetryPolicy::exponential()
            .initial_delay(S(10))
            .max_delay(S(300))
            .max_attempts(6);
        assert_eq!(p.schedule(), vec![S(10), S(20), S(40), S(80), S(160)]);
        let d = RetryPolicy::exponential();
        assert_eq!((d.attempts(), d.schedule()), (3, vec![S(1), S(2)]));
    }
}
