//! What a service's run did: why it stopped, what each part finished, gave back and abandoned,
//! and the exit code a `main` returns ([`ServiceReport::exit_code`]).

use std::time::Duration;

/// Why a service stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM (15) or SIGINT (2).
    Signal(i32),
    /// [`RunningService::stop`](super::RunningService::stop), a
    /// [`StopHandle`](crate::StopHandle), or a drain asked for.
    Asked,
    /// A part ended on its own (its consumer failed for good: the queue deleted, the connection
    /// closed for good).
    PartFailed {
        /// The part's name.
        part: String,
    },
}

/// What stopping one part did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartReport {
    /// The part's name.
    pub name: String,
    /// Messages it handled in its life (a relay: records published).
    pub handled: u64,
    /// Handlers running when the drain began that finished in time.
    pub finished_in_time: usize,
    /// Deliveries received and never started, given back to the queue.
    pub requeued: usize,
    /// Handlers still running at the deadline: their deliveries were given back to the queue,
    /// their results will be dropped.
    pub abandoned: usize,
    /// Why it failed, or could not stop cleanly.
    pub error: Option<String>,
}

/// What a service's run did, from its start to its last connection closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceReport {
    /// The service's name ([`ServiceOptions::new`](super::ServiceOptions::new)).
    pub service: String,
    /// Why it stopped.
    pub reason: StopReason,
    /// How long the drain took, from the stop to the connections closed.
    pub drained_in: Duration,
    /// The drain's deadline ([`ServiceOptions::drain_timeout`](super::ServiceOptions::drain_timeout)).
    pub deadline: Duration,
    /// Each part, in the order they stopped.
    pub parts: Vec<PartReport>,
}

impl ServiceReport {
    /// Handlers abandoned at the deadline, over every part.
    pub fn abandoned(&self) -> usize {
        self.parts.iter().map(|p| p.abandoned).sum()
    }

    /// True when every part stopped within the deadline with nothing abandoned and no error.
    pub fn is_clean(&self) -> bool {
        self.abandoned() == 0 && self.parts.iter().all(|p| p.error.is_none())
    }

    /// The code for `std::process::exit`: 0 for a clean stop asked for (a signal, a handle);
    /// 75 (`EX_TEMPFAIL`, as the family's Ruby host exits) when handlers were abandoned at the
    /// deadline — their messages are back on the queue; 1 when a part failed.
    pub fn exit_code(&self) -> i32 {
        if matches!(self.reason, StopReason::PartFailed { .. })
            || self.parts.iter().any(|p| p.error.is_some())
        {
            1
        } else if self.abandoned() > 0 {
            75
        } else {
            0
        }
    }
}

impl std::fmt::Display for ServiceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match &self.reason {
            StopReason::Signal(n) => format!("signal {n}"),
            StopReason::Asked => "asked to".to_string(),
            StopReason::PartFailed { part } => format!("{part} failed"),
        };
        write!(
            f,
            "{} stopped ({why}); drained in {:?} of {:?}",
            self.service, self.drained_in, self.deadline
        )?;
        for p in &self.parts {
            write!(
                f,
                "; {}: handled {}, finished in time {}, given back {}, abandoned {}",
                p.name, p.handled, p.finished_in_time, p.requeued, p.abandoned
            )?;
            if let Some(e) = &p.error {
                write!(f, ", error: {e}")?;
            }
        }
        Ok(())
    }
}
