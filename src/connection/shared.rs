//! What every clone of a connection and its supervisor share: the options, the link state,
//! the remembered topology, the byte budget, the blocked state; and joining the supervisor.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use super::address::Address;
use super::budget::ByteBudget;
use super::link::Link;
use super::options::ConnectionOptions;
use super::topology::Topology;

pub(crate) struct Shared {
    pub(crate) options: ConnectionOptions,
    /// `service@host`, stamped as `x-acemq-origin` on what this connection publishes.
    pub(crate) origin: String,
    /// The bytes its publishers have handed over and not yet had answered.
    pub(crate) budget: Arc<ByteBudget>,
    pub(super) addresses: Vec<Address>,
    pub(super) state: Mutex<LinkState>,
    pub(super) changed: Condvar,
    pub(crate) topology: Mutex<Topology>,
    /// What the broker said when it blocked publishing (`connection.blocked`), until it
    /// unblocks or the link is replaced.
    pub(crate) blocked: Arc<Mutex<Option<String>>>,
    pub(super) control: Sender<Control>,
    /// What [`Connection::health`](super::Connection::health) reads beside the link state: the
    /// registered sources, the application's checks, the reconnects.
    pub(crate) health: super::health_state::HealthState,
    pub(super) supervisor: Mutex<Option<Supervisor>>,
}

/// The supervisor thread, and a receiver that disconnects when it ends (so that it can be
/// joined with a deadline).
pub(super) struct Supervisor {
    pub(super) handle: JoinHandle<()>,
    pub(super) ended: Receiver<()>,
}

/// How long dropping the last [`Connection`] handle waits for the supervisor to close the AMQP
/// connection and end: 5 s (or the operation timeout, if shorter).
const SUPERVISOR_DROP_JOIN: Duration = Duration::from_secs(5);

impl Shared {
    /// Joins the supervisor thread, waiting up to `deadline` for it to end; past it (or when
    /// called on the supervisor thread itself, which may drop the last handle) it is left to
    /// end by itself.
    pub(super) fn join_supervisor(&self, deadline: Instant) {
        let Some(s) = self.supervisor.lock().take() else {
            return;
        };
        if s.handle.thread().id() == std::thread::current().id() {
            return; // it returns once this drop is over
        }
        match s.ended.recv_deadline(deadline) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if s.handle.join().is_err() {
                    log::error!("acemq: the supervisor thread panicked");
                }
            }
            _ => log::warn!(
                "acemq: the supervisor thread did not end in time (closing the AMQP connection \
                 takes long: a stalled link?); it ends by itself"
            ),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The supervisor holds only a Weak: tell it to close the AMQP connection and end, and
        // join it (with a deadline).
        let _ = self.control.send(Control::Close);
        let wait = SUPERVISOR_DROP_JOIN.min(self.options.operation_timeout);
        self.join_supervisor(Instant::now() + wait);
    }
}

pub(super) enum Control {
    Close,
}

pub(super) enum LinkState {
    Up(Arc<Link>),
    Down { last_error: String },
    Closed,
}
