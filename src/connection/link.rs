//! One live amiquip connection (a link) and its channel opens, each bounded by a deadline on a
//! thread of its own (`acemq-channel-open`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::address::Address;
use crate::error::{Error, Result};
use crate::transport::{Channel, Transport};

/// One live amiquip connection, with the generation it was made in.
pub(crate) struct Link {
    pub(crate) generation: u64,
    pub(crate) address: String,
    /// The broker's version as it announced it on this link (`Transport::broker_version`).
    pub(crate) broker_version: Option<String>,
    /// What the transport can do (`Transport::capabilities`).
    pub(crate) capabilities: crate::transport::Capabilities,
    /// The AMQP connection and what a channel open needs of the link, shared with the threads
    /// that make the opens.
    pub(super) opener: Arc<Opener>,
    /// How long a channel open waits: the operation timeout.
    open_wait: Duration,
}

/// The AMQP connection, held across a channel open (amiquip takes it `&mut`) by the thread that
/// makes it; only ever waited for with a deadline.
pub(super) struct Opener {
    address: String,
    pub(super) amqp: Mutex<Option<Box<dyn Transport>>>,
    /// The connection was closed while a channel open held `amqp`: that open closes the AMQP
    /// connection when it returns.
    pub(super) closing: AtomicBool,
}

impl Opener {
    /// Opens a channel, waiting up to `deadline` for another open to finish.
    fn open(&self, deadline: Instant, wait: Duration) -> Result<Channel> {
        let Some(mut amqp) = self.amqp.try_lock_until(deadline) else {
            return Err(Error::ConnectionLost {
                context: format!(
                    "opening a channel: another channel open on this connection has not been \
                     answered in {wait:?} (a stalled connection?)"
                ),
            });
        };
        let opened = match amqp.as_mut() {
            Some(c) => c
                .open_channel()
                .map_err(|e| Error::amqp("opening a channel", e)),
            None => Err(Error::ConnectionLost {
                context: "opening a channel".into(),
            }),
        };
        if self.closing.load(Ordering::SeqCst) {
            // Closed while this open was under way: closing the AMQP connection fell to it.
            let taken = amqp.take();
            drop(amqp);
            if let Some(c) = taken {
                if let Err(e) = c.close() {
                    log::debug!("acemq: closing the connection to {}: {e}", self.address);
                }
            }
            drop(opened);
            return Err(Error::Closed { what: "connection" });
        }
        opened
    }
}

impl Link {
    pub(super) fn new(
        generation: u64,
        address: &Address,
        amqp: Box<dyn Transport>,
        open_wait: Duration,
    ) -> Link {
        Link {
            generation,
            address: address.to_string(),
            broker_version: amqp.broker_version(),
            capabilities: amqp.capabilities(),
            opener: Arc::new(Opener {
                address: address.to_string(),
                amqp: Mutex::new(Some(amqp)),
                closing: AtomicBool::new(false),
            }),
            open_wait,
        }
    }

    /// Opens a channel on this link, within the operation timeout.
    pub(crate) fn open_channel(&self) -> Result<Channel> {
        self.open_channel_within(self.open_wait)
    }

    /// Opens a channel on this link, within `wait`. amiquip's open is a round trip it does not
    /// bound (on a stalled link it returns when the heartbeats give up; under a memory alarm the
    /// broker does not read it at all), so it is made on a thread of its own
    /// (`acemq-channel-open`): past `wait` the caller gets [`Error::ConnectionLost`], and a
    /// channel opened after that is closed by that thread.
    pub(crate) fn open_channel_within(&self, wait: Duration) -> Result<Channel> {
        let deadline = Instant::now() + wait;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let opener = self.opener.clone();
        let spawned = std::thread::Builder::new()
            .name("acemq-channel-open".into())
            .spawn(move || {
                let opened = opener.open(deadline, wait);
                // Nobody waits for it any more: the channel is closed (dropped) here.
                drop(tx.send(opened));
            });
        if let Err(e) = spawned {
            log::debug!("acemq: no thread for a channel open ({e}); opening on this one");
            return self.opener.open(deadline, wait);
        }
        match rx.recv_deadline(deadline) {
            Ok(opened) => opened,
            Err(_) => Err(Error::ConnectionLost {
                context: format!(
                    "opening a channel: not answered in {wait:?} (a stalled or blocked \
                     connection?)"
                ),
            }),
        }
    }

    /// Closes the AMQP connection, waiting up to `deadline` for a channel open under way;
    /// past it, that open closes the connection when it returns.
    pub(super) fn close_within(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        self.opener.closing.store(true, Ordering::SeqCst);
        let Some(mut amqp) = self.opener.amqp.try_lock_until(deadline) else {
            return Err(Error::Timeout {
                what: "a channel open on the connection to finish before closing it (it closes \
                       the AMQP connection when it returns)"
                    .into(),
                after: timeout,
            });
        };
        let taken = amqp.take();
        drop(amqp);
        match taken {
            Some(c) => c
                .close()
                .map_err(|e| Error::amqp("closing the connection", e)),
            None => Ok(()),
        }
    }
}

/// Closes the link's AMQP connection; when a channel open holds it (a stalled link), that
/// open closes it when it returns.
pub(super) fn close_link(link: &Link) {
    link.opener.closing.store(true, Ordering::SeqCst);
    let Some(mut amqp) = link.opener.amqp.try_lock() else {
        return;
    };
    let taken = amqp.take();
    drop(amqp);
    if let Some(amqp) = taken {
        if let Err(e) = amqp.close() {
            log::debug!("acemq: closing the connection to {}: {e}", link.address);
        }
    }
}
