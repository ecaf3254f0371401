//! The messages of a running consumer's flow control (`flow.rs`) to its thread
//! (`lifecycle.rs`), and how one subscription's life ends (`runtime.rs` `run_on`).

use crossbeam_channel::Sender;

use crate::consume::report::CloseReport;
use crate::error::Result;

/// What the application asks of a running consumer.
pub(crate) enum Control {
    /// End the subscription and wait for a resume; the report of its end goes back.
    Pause(Sender<CloseReport>),
    /// Subscribe again (a consumer that is not paused answers at once).
    Resume(Sender<Result<()>>),
    /// End the subscription and subscribe again with these.
    Scale {
        concurrency: usize,
        prefetch: u16,
        reply: Sender<Result<()>>,
    },
}

/// How one subscription's life ended (`runtime.rs` `run_on`).
pub(crate) enum Ended {
    /// Stopped, for good: the consumer's report.
    Closed(CloseReport),
    /// A [`Control`] ended the subscription: the report of its end, and the control to carry
    /// out.
    Control(CloseReport, Control),
}

impl Ended {
    pub(crate) fn report(self) -> CloseReport {
        match self {
            Ended::Closed(r) | Ended::Control(r, _) => r,
        }
    }
}

/// Where the owner reports its first subscription; `retry`: a failure to subscribe is retried
/// as after a reconnect (a resume), not the caller's error (a start).
pub(crate) struct Started {
    pub(crate) tx: Sender<Result<()>>,
    pub(crate) retry: bool,
}
