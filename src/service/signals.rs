//! SIGTERM and SIGINT for the service host, through `signal-hook` (its iterator on a thread of
//! its own, `acemq-signals`, forwarding each signal to a channel the host waits on beside its
//! stop handle). While it listens, the signals no longer end the process by themselves.

use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};

/// The signals the host drains on.
#[cfg(unix)]
const SIGNALS: [i32; 2] = [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT];

pub(super) struct Signals {
    rx: Receiver<i32>,
    #[cfg(unix)]
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl Signals {
    /// Starts listening.
    #[cfg(unix)]
    pub(super) fn listen() -> Result<Signals> {
        let io = |context: &str, source| Error::Io {
            context: context.into(),
            source,
        };
        let mut signals = signal_hook::iterator::Signals::new(SIGNALS)
            .map_err(|e| io("registering SIGTERM and SIGINT", e))?;
        let handle = signals.handle();
        // A few slots: the host needs the first; later ones past a full channel are dropped.
        let (tx, rx) = crossbeam_channel::bounded(SIGNALS.len() * 4);
        let thread = std::thread::Builder::new()
            .name("acemq-signals".into())
            .spawn(move || {
                for n in signals.forever() {
                    let _ = tx.try_send(n);
                }
            })
            .map_err(|e| io("spawning the signal thread", e))?;
        Ok(Signals {
            rx,
            handle,
            thread: Some(thread),
        })
    }

    /// Not on this platform: nothing arrives.
    #[cfg(not(unix))]
    pub(super) fn listen() -> Result<Signals> {
        Ok(Signals {
            rx: crossbeam_channel::never(),
            thread: None,
        })
    }

    pub(super) fn receiver(&self) -> &Receiver<i32> {
        &self.rx
    }

    /// Stops listening and joins the thread.
    pub(super) fn close(mut self) {
        #[cfg(unix)]
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
