//! The application's own checks: closures registered with a name and a deadline, each run on
//! a thread of its own and waited for with its deadline, so the whole answer comes back within
//! the longest deadline. A check still running from an earlier answer is not started again:
//! inside its deadline the new answer waits for that same run (two probes at once share it);
//! past its deadline it is reported down (still running), so at most one thread per check is
//! ever busy with it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::report::{HealthReport, HealthStatus};
use crate::error::{Error, Result};

/// The deadline the family gives a check when none is said: 5 s (Python's
/// `aggregate_health(timeout=5.0)`, Go's actuator `Timeout`).
pub const DEFAULT_CHECK_DEADLINE: Duration = Duration::from_secs(5);

/// The most checks one connection takes.
const MAX_CHECKS: usize = 256;

/// A check's closure.
pub(crate) type CheckFn = Arc<dyn Fn() -> HealthReport + Send + Sync>;

/// One run of a check: its result once the thread has one.
struct Run {
    started: Instant,
    result: Mutex<Option<HealthReport>>,
    done: Condvar,
}

struct Check {
    name: String,
    deadline: Duration,
    run: CheckFn,
    /// The run under way, or the last one.
    current: Mutex<Option<Arc<Run>>>,
}

/// The checks registered on one connection.
#[derive(Default)]
pub(crate) struct AppChecks {
    checks: Mutex<Vec<Arc<Check>>>,
}

impl AppChecks {
    /// Registers a check.
    pub(crate) fn add(&self, name: &str, deadline: Duration, run: CheckFn) -> Result<()> {
        if name.trim().is_empty() {
            return Err(Error::invalid("a health check's name must not be empty"));
        }
        if deadline.is_zero() {
            return Err(Error::invalid(format!(
                "the health check {name:?}: its deadline must not be zero"
            )));
        }
        let mut checks = self.checks.lock();
        if checks.iter().any(|c| c.name == name) {
            return Err(Error::invalid(format!(
                "a health check named {name:?} is registered already"
            )));
        }
        if checks.len() >= MAX_CHECKS {
            return Err(Error::invalid(format!(
                "at most {MAX_CHECKS} health checks per connection"
            )));
        }
        checks.push(Arc::new(Check {
            name: name.to_string(),
            deadline,
            run,
            current: Mutex::new(None),
        }));
        Ok(())
    }

    /// Removes the check named `name`; false when there was none.
    pub(crate) fn remove(&self, name: &str) -> bool {
        let mut checks = self.checks.lock();
        let before = checks.len();
        checks.retain(|c| c.name != name);
        checks.len() != before
    }

    /// Runs every check at once and waits for each up to its deadline.
    pub(crate) fn run_all(&self) -> Vec<(String, HealthReport)> {
        let checks: Vec<Arc<Check>> = self.checks.lock().clone();
        // Start them all first, then wait: the whole answer takes the longest deadline.
        let runs: Vec<(Arc<Check>, Started)> = checks
            .into_iter()
            .map(|c| {
                let run = start(&c);
                (c, run)
            })
            .collect();
        runs.into_iter()
            .map(|(check, run)| {
                let report = match run {
                    Ok(run) => wait(&check, &run),
                    Err(report) => report,
                };
                (check.name.clone(), report)
            })
            .collect()
    }
}

/// A run started, or the report of why none was.
type Started = std::result::Result<Arc<Run>, HealthReport>;

/// Starts a run of `check` on a thread, unless one is still under way (then `Err` with the
/// report that says so).
fn start(check: &Arc<Check>) -> Started {
    let mut current = check.current.lock();
    if let Some(run) = current.as_ref() {
        if run.result.lock().is_none() {
            let since = run.started.elapsed();
            if since < check.deadline {
                // Another probe's run, still inside its deadline: this answer shares it.
                return Ok(Arc::clone(run));
            }
            return Err(timed_out(check).part(
                "running_for_ms",
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX),
            ));
        }
    }
    let run = Arc::new(Run {
        started: Instant::now(),
        result: Mutex::new(None),
        done: Condvar::new(),
    });
    let on_thread = Arc::clone(&run);
    let f = Arc::clone(&check.run);
    let name = check.name.clone();
    let spawned = std::thread::Builder::new()
        .name("acemq-health-check".into())
        .spawn(move || {
            let report = std::panic::catch_unwind(AssertUnwindSafe(|| f())).unwrap_or_else(|p| {
                HealthReport::down(format!(
                    "the check itself failed: it panicked ({})",
                    crate::error::panic_message(&*p)
                ))
            });
            *on_thread.result.lock() = Some(report);
            on_thread.done.notify_all();
        });
    if let Err(e) = spawned {
        return Err(HealthReport::down(format!(
            "the check {name:?} could not be started: {e}"
        )));
    }
    *current = Some(Arc::clone(&run));
    Ok(run)
}

/// Waits for `run` up to its check's deadline.
fn wait(check: &Check, run: &Run) -> HealthReport {
    let deadline = run.started + check.deadline;
    let mut result = run.result.lock();
    while result.is_none() {
        if run.done.wait_until(&mut result, deadline).timed_out() {
            break;
        }
    }
    match result.as_ref() {
        Some(report) => report.clone(),
        None => timed_out(check),
    }
}

/// Down, as the family reports a check that did not answer in time.
fn timed_out(check: &Check) -> HealthReport {
    HealthReport::new(
        HealthStatus::Down,
        format!("did not answer within {:?}", check.deadline),
    )
    .part("timed_out", true)
}
