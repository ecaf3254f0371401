//! The data a dead-letter replay pass reports ([`ReplayReport`], [`Stopped`]), here in the base
//! layer because [`Error::Replay`](crate::Error::Replay) and
//! [`ReplayEvent`](crate::observe::ReplayEvent) carry it; its one public path is
//! [`patterns::replay`](crate::patterns::replay), the pattern that makes it.

use std::fmt;
use std::time::Duration;

/// Why a replay pass stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// The source queue had nothing more to offer.
    Drained,
    /// [`limit`](crate::patterns::replay::ReplayOptions::limit) messages matched.
    Limit,
    /// [`deadline`](crate::patterns::replay::ReplayOptions::deadline) passed.
    Deadline,
    /// [`window`](crate::patterns::replay::ReplayOptions::window) messages were held (declined, or read by a dry run).
    Window,
    /// A failure stopped it (only in the report inside [`Error::Replay`](crate::Error::Replay)).
    Failed,
}

impl Stopped {
    /// `drained`, `limit`, `deadline`, `window` or `failed`, as the family reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stopped::Drained => "drained",
            Stopped::Limit => "limit",
            Stopped::Deadline => "deadline",
            Stopped::Window => "window",
            Stopped::Failed => "failed",
        }
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a replay pass did, and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The queue read.
    pub queue: String,
    /// Republished, confirmed, and acknowledged on the source queue.
    pub moved: u64,
    /// Declined by the filter: still on the source queue, in their order.
    pub skipped: u64,
    /// Accepted by the filter: equal to `moved` in a pass that ran to its end, the ones that
    /// would move in a dry run, one more than `moved` when a move failed.
    pub matched: u64,
    /// True for a [`dry_run`](crate::patterns::replay::ReplayOptions::dry_run) pass.
    pub dry_run: bool,
    /// Why it stopped.
    pub stopped: Stopped,
    /// How long it ran.
    pub elapsed: Duration,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dry_run {
            write!(
                f,
                "dry run: would move {}, skipped {} ({})",
                self.matched, self.skipped, self.stopped
            )
        } else {
            write!(
                f,
                "moved {}, skipped {} ({})",
                self.moved, self.skipped, self.stopped
            )
        }
    }
}
