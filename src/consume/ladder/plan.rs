//! What the ladder does with a verdict, decided before anything is published: from the policy,
//! the message's attempt and age and the verdict alone — no broker, no clock, no randomness —
//! so that every branch of the decision is a test below. [`copies`](super::copies) carries a
//! [`Plan`] out (and jitters the waits the plan marks).

use std::time::Duration;

use super::policy::{NextWait, RetryPolicy};
use crate::consume::outcome::{format_duration, Verdict};
use crate::envelope::{now_ms, Message};
use crate::observe::Decision;

/// Where a set-aside copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::consume) enum SetAside {
    /// `{queue}.dlq`.
    DeadLetter,
    /// `{queue}.parked`.
    Parked,
}

/// What a verdict becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::consume) enum Plan {
    /// Acknowledge the original.
    Ack,
    /// Hold the same delivery, unacknowledged, and run the handler on it again with `attempt`
    /// after `wait` (an ordered message whose retries keep its key); `jitter`: a retry's wait,
    /// jittered by the policy (an in-progress wait is not).
    RunAgain {
        wait: Duration,
        attempt: u32,
        jitter: bool,
    },
    /// A copy with `attempt` after `wait`, then the original acknowledged: on the broker's
    /// `rung` when the wait is the broker's (`{queue}.retry.{rung}`), else held in the consumer
    /// (jittered for a retry) and sent to the queue itself. `retry`: a retry (else an
    /// in-progress answer, attempt unchanged).
    Copy {
        wait: Duration,
        attempt: u32,
        rung: Option<Duration>,
        retry: bool,
    },
    /// A copy to `.dlq` or `.parked` with `error` as its `x-acemq-error`, then the original
    /// acknowledged; `decision` tells the handler's own reject from the consumer's.
    SetAside {
        to: SetAside,
        error: String,
        decision: Decision,
    },
}

impl Plan {
    /// What the observer, the metrics and the trace are told the consumer decided (unless the
    /// plan's copy then fails: [`Decision::CopyFailed`]).
    pub(in crate::consume) fn decision(&self) -> Decision {
        match self {
            Plan::Ack => Decision::Accept,
            Plan::RunAgain { jitter: true, .. } | Plan::Copy { retry: true, .. } => Decision::Retry,
            Plan::RunAgain { .. } | Plan::Copy { .. } => Decision::InProgress,
            Plan::SetAside { decision, .. } => *decision,
        }
    }
}

/// The family's `x-acemq-error` of a message dead-lettered after `attempts` failed attempts,
/// the last failing with `why` (the consumer's, and the acknowledged consumer's after its
/// `dead_letter_after`).
pub(crate) fn exhausted(attempts: u32, why: impl std::fmt::Display) -> String {
    let plural = if attempts == 1 { "" } else { "s" };
    format!("exhausted {attempts} attempt{plural}: {why}")
}

/// [`plan`] for `message` now: its age counted from its first-seen time.
pub(in crate::consume) fn plan_for(
    policy: &RetryPolicy,
    message: &Message,
    verdict: &Verdict,
    hold: bool,
) -> Plan {
    // Only a retry weighs the age: an accepted message does not read the clock.
    let age = if matches!(verdict, Verdict::Retry { .. }) {
        let age_ms =
            u64::try_from(now_ms().saturating_sub(message.envelope.first_seen_ms)).unwrap_or(0);
        Duration::from_millis(age_ms)
    } else {
        Duration::ZERO
    };
    plan(policy, message.envelope.attempt, age, verdict, hold)
}

/// The whole decision: a retry is another attempt while the policy has one (and age) left, on a
/// rung when its wait is the broker's, and otherwise the consumer's dead letter; the handler's
/// own dead letter, park and in-progress answers are what it said. With `hold` a retry or an
/// in-progress wait is spent on the same delivery, whatever its length.
pub(in crate::consume) fn plan(
    policy: &RetryPolicy,
    attempt: u32,
    age: Duration,
    verdict: &Verdict,
    hold: bool,
) -> Plan {
    let rung = |wait: Duration| {
        Some(wait)
            .filter(|w| policy.waits_in_broker(*w))
            .and_then(|w| policy.rung_for(w))
    };
    match verdict {
        Verdict::Accept => Plan::Ack,
        Verdict::Retry { delay, why } => match policy.next_wait(attempt, age) {
            NextWait::Wait(wait) => {
                let wait = delay.unwrap_or(wait);
                let attempt = attempt.saturating_add(1);
                if hold {
                    Plan::RunAgain {
                        wait,
                        attempt,
                        jitter: true,
                    }
                } else {
                    Plan::Copy {
                        wait,
                        attempt,
                        rung: rung(wait),
                        retry: true,
                    }
                }
            }
            NextWait::Exhausted => Plan::SetAside {
                to: SetAside::DeadLetter,
                error: exhausted(policy.attempts(), why),
                decision: Decision::DeadLetter,
            },
            NextWait::TooOld(limit) => Plan::SetAside {
                to: SetAside::DeadLetter,
                error: format!(
                    "exceeded the maximum message age of {}: {why}",
                    format_duration(limit)
                ),
                decision: Decision::DeadLetter,
            },
        },
        Verdict::DeadLetter { error } => Plan::SetAside {
            to: SetAside::DeadLetter,
            error: error.clone(),
            decision: Decision::Reject,
        },
        Verdict::Park { error } => Plan::SetAside {
            to: SetAside::Parked,
            error: error.clone(),
            decision: Decision::Park,
        },
        Verdict::InProgress { delay } if hold => Plan::RunAgain {
            wait: *delay,
            attempt,
            jitter: false,
        },
        Verdict::InProgress { delay } => Plan::Copy {
            wait: *delay,
            attempt,
            rung: rung(*delay),
            retry: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn retry(why: &str) -> Verdict {
        Verdict::Retry {
            delay: None,
            why: why.into(),
        }
    }

    /// Three attempts, 1 s then 2 s, every wait of 1 s or more on the broker's rungs.
    fn laddered() -> RetryPolicy {
        RetryPolicy::exponential()
            .max_attempts(3)
            .initial_delay(S)
            .multiplier(2.0)
            .broker_wait_threshold(S)
    }

    #[test]
    fn an_accepted_message_is_acknowledged() {
        let p = plan(&laddered(), 1, Duration::ZERO, &Verdict::Accept, false);
        assert_eq!(p, Plan::Ack);
        assert_eq!(p.decision(), Decision::Accept);
    }

    #[test]
    fn a_retry_with_attempts_left_goes_to_the_rung_of_its_wait_with_the_next_attempt() {
        let p = plan(&laddered(), 2, Duration::ZERO, &retry("boom"), false);
        let wait = 2 * S;
        let rung = Some(wait);
        assert_eq!(
            p,
            Plan::Copy {
                wait,
                attempt: 3,
                rung,
                retry: true
            }
        );
        assert_eq!(p.decision(), Decision::Retry);
    }

    #[test]
    fn a_retry_shorter_than_the_threshold_is_held_in_the_consumer() {
        let policy = laddered().broker_wait_threshold(5 * S);
        let p = plan(&policy, 1, Duration::ZERO, &retry("boom"), false);
        assert_eq!(
            p,
            Plan::Copy {
                wait: S,
                attempt: 2,
                rung: None,
                retry: true
            }
        );
    }

    #[test]
    fn the_handlers_own_delay_replaces_the_policys_wait_and_picks_the_rung_at_least_as_long() {
        let verdict = Verdict::Retry {
            delay: Some(Duration::from_millis(1500)),
            why: "later".into(),
        };
        let p = plan(&laddered(), 1, Duration::ZERO, &verdict, false);
        assert_eq!(
            p,
            Plan::Copy {
                wait: Duration::from_millis(1500),
                attempt: 2,
                rung: Some(2 * S),
                retry: true
            }
        );
    }

    #[test]
    fn a_held_retry_runs_again_on_the_same_delivery_with_a_jittered_wait() {
        let p = plan(&laddered(), 1, Duration::ZERO, &retry("boom"), true);
        assert_eq!(
            p,
            Plan::RunAgain {
                wait: S,
                attempt: 2,
                jitter: true
            }
        );
        assert_eq!(p.decision(), Decision::Retry);
    }

    #[test]
    fn a_retry_of_the_last_attempt_is_the_consumers_dead_letter_held_or_not() {
        for hold in [false, true] {
            let p = plan(&laddered(), 3, Duration::ZERO, &retry("boom"), hold);
            assert_eq!(
                p,
                Plan::SetAside {
                    to: SetAside::DeadLetter,
                    error: "exhausted 3 attempts: boom".into(),
                    decision: Decision::DeadLetter
                }
            );
        }
        let one = plan(&RetryPolicy::none(), 1, Duration::ZERO, &retry("x"), false);
        assert!(
            matches!(&one, Plan::SetAside { error, .. } if error == "exhausted 1 attempt: x"),
            "{one:?}"
        );
    }

    #[test]
    fn a_retry_past_the_age_limit_is_the_consumers_dead_letter_whatever_attempts_are_left() {
        let policy = laddered().max_message_age(Duration::from_secs(60));
        let p = plan(&policy, 1, Duration::from_secs(61), &retry("slow"), false);
        assert_eq!(p.decision(), Decision::DeadLetter);
        assert!(
            matches!(&p, Plan::SetAside { to: SetAside::DeadLetter, error, .. }
                if error.starts_with("exceeded the maximum message age of") && error.ends_with(": slow")),
            "{p:?}"
        );
        let young = plan(&policy, 1, Duration::from_secs(59), &retry("slow"), false);
        assert_eq!(young.decision(), Decision::Retry);
    }

    #[test]
    fn the_handlers_own_dead_letter_is_a_reject_to_the_dlq_with_its_error() {
        let verdict = Verdict::DeadLetter {
            error: "bad order".into(),
        };
        let p = plan(&laddered(), 1, Duration::ZERO, &verdict, false);
        assert_eq!(
            p,
            Plan::SetAside {
                to: SetAside::DeadLetter,
                error: "bad order".into(),
                decision: Decision::Reject
            }
        );
    }

    #[test]
    fn a_park_goes_to_the_parked_queue_with_its_error() {
        let verdict = Verdict::Park {
            error: "later by hand".into(),
        };
        let p = plan(&laddered(), 2, Duration::ZERO, &verdict, false);
        assert_eq!(
            p,
            Plan::SetAside {
                to: SetAside::Parked,
                error: "later by hand".into(),
                decision: Decision::Park
            }
        );
    }

    #[test]
    fn an_in_progress_answer_comes_back_with_its_attempt_unchanged_and_unjittered() {
        let verdict = Verdict::InProgress {
            delay: Duration::from_millis(300),
        };
        let copied = plan(&laddered(), 2, Duration::ZERO, &verdict, false);
        assert_eq!(
            copied,
            Plan::Copy {
                wait: Duration::from_millis(300),
                attempt: 2,
                rung: None,
                retry: false
            }
        );
        assert_eq!(copied.decision(), Decision::InProgress);
        let held = plan(&laddered(), 2, Duration::ZERO, &verdict, true);
        assert_eq!(
            held,
            Plan::RunAgain {
                wait: Duration::from_millis(300),
                attempt: 2,
                jitter: false
            }
        );
        assert_eq!(held.decision(), Decision::InProgress);
    }

    #[test]
    fn a_policy_without_a_threshold_holds_every_wait_in_the_consumer() {
        let policy = laddered().broker_wait_threshold(Duration::ZERO);
        let p = plan(&policy, 1, Duration::ZERO, &retry("boom"), false);
        assert!(matches!(p, Plan::Copy { rung: None, .. }), "{p:?}");
    }
}
