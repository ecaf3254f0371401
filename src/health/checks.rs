//! The application's own checks, and the run-once machinery they share with the broker link's
//! round trip ([`Probe`]): each run on a thread of its own and waited for with its deadline, so
//! the whole answer comes back within the longest deadline. A probe still running from an
//! earlier answer is not started again: inside its deadline the new answer waits for that same
//! run (two probes at once share it); past its deadline it is reported down (still running), so
//! at most one thread per check is ever busy with it. A probe may also reuse a finished run's
//! answer for a while (the broker's round trip: once a second at most), so that health probes
//! arriving every 100 ms do not each ask the broker.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::report::{HealthReport, HealthStatus};
use crate::error::{Error, Result};

/// The deadline the family gives a check when none is said: 5 s (Python's
/// `aggregate_health(timeout=5.0)`, Go's actuator `Timeout`).
pub const DEFAULT_CHECK_DEADLINE: Duration = Duration::from_secs(5);

/// The options of one of the application's checks
/// ([`Connection::add_health_check`](crate::Connection::add_health_check)).
///
/// ```
/// use acemq_amqp::health::HealthCheckOptions;
/// use std::time::Duration;
/// let options = HealthCheckOptions::new().deadline(Duration::from_secs(2));
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct HealthCheckOptions {
    pub(crate) deadline: Duration,
}

impl Default for HealthCheckOptions {
    fn default() -> Self {
        HealthCheckOptions {
            deadline: DEFAULT_CHECK_DEADLINE,
        }
    }
}

impl HealthCheckOptions {
    /// The default options: a deadline of [`DEFAULT_CHECK_DEADLINE`] (the family's 5 s).
    pub fn new() -> Self {
        Self::default()
    }

    /// How long an answer waits for the check: past it the check counts as down (`did not
    /// answer within …`), and a run still going is not started again. Must not be zero.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The one place these options are checked.
    pub(crate) fn validate(&self, name: &str) -> Result<()> {
        if self.deadline.is_zero() {
            return Err(Error::invalid(format!(
                "the health check {name:?}: its deadline must not be zero"
            )));
        }
        Ok(())
    }
}

/// The deadline of the broker link's round trip (Go's `DefaultHealthTimeout`): past it the link
/// is reported down.
pub const ROUND_TRIP_DEADLINE: Duration = Duration::from_secs(3);

/// How long one round trip to the broker answers later health probes: they come every few
/// hundred milliseconds from load balancers and orchestrators, and must not each ask the broker.
pub const ROUND_TRIP_REUSE: Duration = Duration::from_secs(1);

/// The most checks one connection takes.
const MAX_CHECKS: usize = 256;

/// A check's closure.
pub(crate) type CheckFn = Arc<dyn Fn() -> HealthReport + Send + Sync>;

/// One run of a probe: its result, and when it came, once the thread has one.
pub(crate) struct Run {
    started: Instant,
    result: Mutex<Option<(HealthReport, Instant)>>,
    done: Condvar,
}

/// Runs one kind of check at most once at a time, under a deadline (see the module docs).
pub(crate) struct Probe {
    deadline: Duration,
    /// How long a finished run's answer is given again instead of a new run.
    reuse: Duration,
    /// The run under way, or the last one.
    current: Mutex<Option<Arc<Run>>>,
}

/// What [`Probe::start`] did: a run to wait for (new, shared or reused), or none because one is
/// still running past its deadline (for this long), or because no thread could be started.
pub(crate) enum Started {
    Run(Arc<Run>),
    Busy(Duration),
    Failed(String),
}

impl Probe {
    pub(crate) fn new(deadline: Duration, reuse: Duration) -> Probe {
        Probe {
            deadline,
            reuse,
            current: Mutex::new(None),
        }
    }

    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Starts a run of `f` on a thread named `thread`, unless one is still under way or a
    /// finished one is recent enough to give again.
    pub(crate) fn start(
        &self,
        thread: &str,
        f: impl FnOnce() -> HealthReport + Send + 'static,
    ) -> Started {
        let mut current = self.current.lock();
        if let Some(run) = current.as_ref() {
            match run.result.lock().as_ref() {
                None => {
                    let since = run.started.elapsed();
                    if since < self.deadline {
                        // Another probe's run, still inside its deadline: this answer shares it.
                        return Started::Run(Arc::clone(run));
                    }
                    return Started::Busy(since);
                }
                Some((_, at)) if at.elapsed() < self.reuse => {
                    return Started::Run(Arc::clone(run));
                }
                Some(_) => {}
            }
        }
        let run = Arc::new(Run {
            started: Instant::now(),
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        let on_thread = Arc::clone(&run);
        let spawned = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || {
                let report = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
                    HealthReport::down(format!(
                        "the check itself failed: it panicked ({})",
                        crate::error::panic_message(&*p)
                    ))
                });
                *on_thread.result.lock() = Some((report, Instant::now()));
                on_thread.done.notify_all();
            });
        if let Err(e) = spawned {
            return Started::Failed(e.to_string());
        }
        *current = Some(Arc::clone(&run));
        Started::Run(run)
    }

    /// Waits for `run` up to the deadline: its report, or `None` when it did not answer in time.
    pub(crate) fn wait(&self, run: &Run) -> Option<HealthReport> {
        let deadline = run.started + self.deadline;
        let mut result = run.result.lock();
        while result.is_none() {
            if run.done.wait_until(&mut result, deadline).timed_out() {
                break;
            }
        }
        result.as_ref().map(|(report, _)| report.clone())
    }
}

struct Check {
    name: String,
    run: CheckFn,
    probe: Probe,
}

/// The checks registered on one connection.
#[derive(Default)]
pub(crate) struct AppChecks {
    checks: Mutex<Vec<Arc<Check>>>,
}

impl AppChecks {
    /// Registers a check.
    pub(crate) fn add(&self, name: &str, options: &HealthCheckOptions, run: CheckFn) -> Result<()> {
        if name.trim().is_empty() {
            return Err(Error::invalid("a health check's name must not be empty"));
        }
        options.validate(name)?;
        let deadline = options.deadline;
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
            run,
            probe: Probe::new(deadline, Duration::ZERO),
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
                let f = Arc::clone(&c.run);
                let run = c.probe.start("acemq-health-check", move || f());
                (c, run)
            })
            .collect();
        runs.into_iter()
            .map(|(check, run)| {
                let report = match run {
                    Started::Run(run) => {
                        check.probe.wait(&run).unwrap_or_else(|| timed_out(&check))
                    }
                    Started::Busy(since) => timed_out(&check).part(
                        "runningForMillis",
                        u64::try_from(since.as_millis()).unwrap_or(u64::MAX),
                    ),
                    Started::Failed(e) => HealthReport::down(format!(
                        "the check {:?} could not be started: {e}",
                        check.name
                    )),
                };
                (check.name.clone(), report)
            })
            .collect()
    }
}

/// Down, as the family reports a check that did not answer in time.
fn timed_out(check: &Check) -> HealthReport {
    HealthReport::new(
        HealthStatus::Down,
        format!("did not answer within {:?}", check.probe.deadline()),
    )
    .part("timedOut", true)
}
