//! The retry ladder, in one room: what a handler's failure becomes and the copy it publishes.
//!
//! | file | what |
//! |---|---|
//! | `policy.rs` | [`RetryPolicy`](crate::RetryPolicy): the attempts, the waits (exponential, fixed, jittered), the age limit, and where a wait is spent (a rung of the broker's, `{queue}.retry.{wait}`, or held in the consumer); `failure_topology` |
//! | `plan.rs` | the whole decision, from the policy, the attempt, the age and the verdict alone (`plan`, a test per branch): acknowledge, run again on the same delivery, a copy on a rung or held in the consumer, or set aside in `.dlq` / `.parked` — the consumer's dead letter when no attempt or age is left; its typed [`Decision`](crate::observe::Decision) |
//! | `copies.rs` | a plan carried out (`carry_out`): the retry copy on its rung or to the queue, the dead-letter and parked copies, each confirmed before the original is acknowledged; a copy over the frame limit trimmed |
//! | `copy_failures.rs` | a copy that could not be published: its original comes back after a pause that grows per failure |
//! | `timer.rs` | the timer thread: waits held in the consumer (short retries, in-progress answers, copy-failure pauses), the delivery still unacknowledged |

pub(crate) mod copies;
pub(in crate::consume) mod copy_failures;
pub(crate) mod plan;
pub(crate) mod policy;
pub(in crate::consume) mod timer;
