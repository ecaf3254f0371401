//! One broker's state, under one lock: exchanges, queues, connections with their channels
//! (delivery tags, unacked messages, confirms, returns), the faults in force, the clock offset.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use super::reply::{closed, Refusal};
use super::state::{Broker, Chan, Conn, End, Exchange, State};
use crate::transport::{AmqpError, Blocked};

impl Broker {
    pub(super) fn new(name: &str) -> Broker {
        Broker {
            state: Mutex::new(State {
                name: name.to_string(),
                exchanges: Exchange::predeclared(),
                queues: HashMap::new(),
                conns: HashMap::new(),
                next_id: 1,
                seq: 0,
                refuse: false,
                nack_next: 0,
                blocked: None,
                held_queues: HashSet::new(),
                offset: Duration::ZERO,
                clock_running: false,
                dirty: Vec::new(),
                ended: HashMap::new(),
                major: 4,
            }),
            clock: Condvar::new(),
            changed: Condvar::new(),
        }
    }

    /// A new connection's id and its blocked receiver (told at once when an alarm holds).
    pub(super) fn open_connection(
        &self,
        _connection_name: Option<&str>,
    ) -> Result<(u64, Receiver<Blocked>), AmqpError> {
        let mut st = self.state.lock();
        if st.refuse {
            return Err(AmqpError::LinkLost {
                reason: format!("memory broker '{}' refuses connections", st.name),
            });
        }
        let id = st.fresh_id();
        let (tx, rx) = crossbeam_channel::unbounded();
        if let Some(reason) = &st.blocked {
            let _ = tx.send(Blocked::Blocked(reason.clone()));
        }
        st.conns.insert(
            id,
            Conn {
                blocked_tx: tx,
                channels: HashMap::new(),
                closed: HashMap::new(),
                next_channel: 1,
                held: VecDeque::new(),
            },
        );
        Ok((id, rx))
    }

    /// Follows RabbitMQ `major` (3 or 4) from now on: in what is declared, returned and
    /// dead-lettered after this call.
    pub(crate) fn set_major(self: &Arc<Self>, major: u8) {
        self.with(|st| st.major = major);
    }

    /// The RabbitMQ major it follows.
    pub(crate) fn major(self: &Arc<Self>) -> u8 {
        self.with(|st| st.major)
    }

    /// Runs `f` on the state, then dispatches what it made ready and wakes the clock.
    pub(super) fn with<T>(self: &Arc<Self>, f: impl FnOnce(&mut State) -> T) -> T {
        let mut st = self.state.lock();
        let out = f(&mut st);
        st.settle();
        self.wake_clock(&mut st);
        self.changed.notify_all();
        out
    }
}

impl State {
    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The broker clock.
    pub(super) fn now(&self) -> Instant {
        Instant::now() + self.offset
    }

    pub(super) fn mark(&mut self, queue: &str) {
        if !self.dirty.iter().any(|q| q == queue) {
            self.dirty.push(queue.to_string());
        }
    }

    /// Dispatches every queue marked, and any that dispatch marks in turn (dead letters).
    pub(super) fn settle(&mut self) {
        while let Some(q) = self.dirty.pop() {
            self.dispatch(&q);
        }
    }

    /// The channel, if open; else the error amiquip returns on it.
    pub(super) fn chan(&mut self, conn: u64, chan: u16) -> Result<&mut Chan, AmqpError> {
        let Some(c) = self.conns.get_mut(&conn) else {
            let said = self.ended.get_mut(&conn).and_then(Option::take);
            return Err(
                said.map_or_else(closed, |r| AmqpError::ServerClosedConnection {
                    code: r.code,
                    message: r.text,
                }),
            );
        };
        if let Some(r) = c.closed.get_mut(&chan) {
            return Err(r.take().map_or_else(closed, |r| r.error()));
        }
        c.channels
            .get_mut(&chan)
            .ok_or(AmqpError::ClientClosedChannel)
    }

    /// Checks the channel is open (the error amiquip gives if not).
    pub(super) fn check(&mut self, conn: u64, chan: u16) -> Result<(), AmqpError> {
        self.chan(conn, chan).map(drop)
    }

    /// Runs a channel method: a refusal closes the channel, as RabbitMQ does.
    pub(super) fn method<T>(
        &mut self,
        conn: u64,
        chan: u16,
        f: impl FnOnce(&mut State) -> Result<T, Refusal>,
    ) -> Result<T, AmqpError> {
        self.check(conn, chan)?;
        match f(self) {
            Ok(v) => Ok(v),
            Err(r) => {
                let e = r.error();
                self.close_channel(conn, chan, End::Server(r));
                Err(e)
            }
        }
    }

    /// Messages of `queue` delivered and not settled, on every channel.
    pub(super) fn unacked_of(&self, queue: &str) -> u32 {
        let n = self
            .conns
            .values()
            .flat_map(|c| c.channels.values())
            .flat_map(|ch| ch.unacked.values())
            .filter(|u| u.queue == queue)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}
