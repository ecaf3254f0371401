//! [`wait_until`]: wait for a condition with a deadline, never a bare sleep.

use std::time::{Duration, Instant};

/// The first pause between two checks; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between two checks.
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// Waits until `condition` returns true, checking it again and again for at most `deadline`
/// (a duration from now).
///
/// The condition is checked at once, then after pauses that start at 1 ms and double up to
/// 50 ms, so a condition that holds soon is seen soon and one that takes seconds costs little.
/// It is checked one last time at the deadline. It runs on the calling thread; it should be
/// quick and must not block for long (read a counter, a queue's depth, a flag).
///
/// This is how a test waits for something another thread does — a consumer handling a
/// message, a connection coming back — instead of sleeping for a guessed time: it returns as
/// soon as the thing happened, and fails clearly when it did not happen in time.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
/// use acemq_amqp::testing::wait_until;
///
/// let handled = AtomicUsize::new(0);
/// std::thread::scope(|s| {
///     s.spawn(|| handled.fetch_add(1, Ordering::SeqCst));
///     wait_until(Duration::from_secs(5), || handled.load(Ordering::SeqCst) == 1)
///         .expect("the message was handled");
/// });
/// let never = wait_until(Duration::from_millis(20), || false).unwrap_err();
/// assert!(never.to_string().contains("20ms"));
/// ```
///
/// # Errors
///
/// [`TimedOut`] when the condition still does not hold at the deadline.
pub fn wait_until<F>(deadline: Duration, mut condition: F) -> Result<(), TimedOut>
where
    F: FnMut() -> bool,
{
    let start = Instant::now();
    let end = start + deadline;
    let mut pause = FIRST_PAUSE;
    loop {
        if condition() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= end {
            return Err(TimedOut { waited: deadline });
        }
        std::thread::sleep(pause.min(end - now));
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// A condition given to [`wait_until`] did not hold within its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// The deadline it was given.
    pub waited: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the condition did not hold within {:?}", self.waited)
    }
}

impl std::error::Error for TimedOut {}
