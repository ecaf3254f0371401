//! The broker's data, at the bottom of the module (the files that act on it import it from
//! here): the broker and its state, connections, channels, unacked messages, queues with
//! their messages and consumers, exchanges with their bindings, a publish held back, how a
//! channel ends.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use super::reply::Refusal;
use crate::transport::{AmqpProperties, Blocked, Confirm, ConsumerMessage, FieldTable, Return};

/// One broker (`memory://name`).
pub(crate) struct Broker {
    pub(super) state: Mutex<State>,
    /// Wakes the clock thread: a new head deadline, or the clock advanced.
    pub(super) clock: Condvar,
    /// Notified after every change to the state: wakes a `round_trip` waiting for a memory
    /// alarm to release the publishes it holds on its connection.
    pub(super) changed: Condvar,
}

/// Everything the broker knows, under [`Broker::state`].
pub(super) struct State {
    pub(super) name: String,
    pub(super) exchanges: HashMap<String, Exchange>,
    pub(super) queues: HashMap<String, Queue>,
    pub(super) conns: HashMap<u64, Conn>,
    /// Connection ids, consumer tags and generated queue names are numbered from this.
    pub(super) next_id: u64,
    /// The order messages entered the broker in (a requeued message goes back to its place).
    pub(super) seq: u64,
    pub(super) refuse: bool,
    pub(super) nack_next: u32,
    pub(super) blocked: Option<String>,
    pub(super) held_queues: HashSet<String>,
    /// How far the broker clock is ahead of `Instant::now()`.
    pub(super) offset: Duration,
    pub(super) clock_running: bool,
    /// Queues with something to dispatch.
    pub(super) dirty: Vec<String>,
    /// Connections the broker closed, with why: the next call on one fails with it.
    pub(super) ended: HashMap<u64, Option<Refusal>>,
    /// The RabbitMQ major it follows: 4 (the default) or 3 (`MemoryBroker::rabbitmq_major`).
    pub(super) major: u8,
}

/// One connection.
pub(super) struct Conn {
    pub(super) blocked_tx: Sender<Blocked>,
    pub(super) channels: HashMap<u16, Chan>,
    /// Channels the broker closed, with why: the next call on one fails with it (later ones
    /// with `EventLoopDropped`, as amiquip's do once it has handed the error over).
    pub(super) closed: HashMap<u16, Option<Refusal>>,
    pub(super) next_channel: u16,
    /// Publishes held by a memory alarm, in order: (channel, confirm sequence number, publish).
    pub(super) held: VecDeque<(u16, Option<u64>, Outgoing)>,
}

/// One channel.
#[derive(Default)]
pub(super) struct Chan {
    pub(super) next_tag: u64,
    pub(super) unacked: BTreeMap<u64, Unacked>,
    pub(super) confirms: bool,
    pub(super) publish_seq: u64,
    pub(super) confirm_tx: Option<Sender<Confirm>>,
    pub(super) return_tx: Option<Sender<Return>>,
    /// The channel's consumers: tag → queue.
    pub(super) consumers: HashMap<String, String>,
    pub(super) prefetch: u16,
}

/// A delivered, not yet settled message.
pub(super) struct Unacked {
    pub(super) queue: String,
    pub(super) msg: Msg,
    pub(super) consumer: Option<String>,
}

/// A message in a queue (or delivered from one, unsettled).
#[derive(Clone)]
pub(super) struct Msg {
    /// Its place: a requeued message goes back before every later one.
    pub(super) seq: u64,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    pub(super) body: Vec<u8>,
    pub(super) properties: AmqpProperties,
    pub(super) redelivered: bool,
    /// The `expiration` property, in ms (checked at publish).
    pub(super) expiration: Option<u64>,
    /// On the broker clock; set when it enters its queue.
    pub(super) deadline: Option<Instant>,
    /// Its returns to a quorum queue (nack or reject with requeue, its channel's end): the
    /// `x-delivery-count` of its next delivery, held against the queue's delivery limit.
    pub(super) returns: u64,
    /// Its deaths as the broker recorded them (RabbitMQ 4.x counts these, never a client's
    /// `x-death` header); `None` until the broker dead-letters it.
    pub(super) deaths: Option<Deaths>,
}

/// The deaths of a message as RabbitMQ 4.x keeps them beside its headers.
#[derive(Clone, Default)]
pub(super) struct Deaths {
    /// The `x-death` entries, newest first.
    pub(super) entries: Vec<crate::transport::AmqpValue>,
    /// Its first death: exchange, queue, reason.
    pub(super) first: Option<[String; 3]>,
}

/// A subscription on a queue.
pub(super) struct ConsumerEntry {
    pub(super) tag: String,
    pub(super) conn: u64,
    pub(super) chan: u16,
    pub(super) tx: Sender<ConsumerMessage>,
    pub(super) no_ack: bool,
    pub(super) prefetch: u16,
    pub(super) unacked: u32,
    pub(super) exclusive: bool,
}

pub(super) struct Queue {
    pub(super) durable: bool,
    pub(super) owner: Option<u64>,
    pub(super) auto_delete: bool,
    pub(super) arguments: FieldTable,
    pub(super) ttl: Option<u64>,
    pub(super) dlx: Option<String>,
    pub(super) dlrk: Option<String>,
    pub(super) max_len: Option<usize>,
    pub(super) reject_publish: bool,
    pub(super) ready: VecDeque<Msg>,
    pub(super) consumers: Vec<ConsumerEntry>,
    /// The consumer the next delivery starts looking from (round robin).
    pub(super) rr: usize,
    pub(super) had_consumer: bool,
    /// `x-queue-type: quorum`: RabbitMQ's quorum behaviour where the patterns can tell (a
    /// returned message is counted in `x-delivery-count` and held against the delivery limit,
    /// back at the head when the queue has one and at the tail when not; exclusive consumes are
    /// not enforced);
    /// otherwise a classic queue.
    pub(super) quorum: bool,
    /// A quorum queue's delivery limit: a message returned more often is dead-lettered
    /// (`delivery_limit`). `x-delivery-limit`, else 20 on 4.x and none on 3.x; `u64::MAX` for
    /// a value that is not an integer (taken, never reached). With one, returns go to the head;
    /// without, to the tail.
    pub(super) delivery_limit: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Direct => "direct",
            Kind::Fanout => "fanout",
            Kind::Topic => "topic",
            Kind::Headers => "headers",
        }
    }
}

pub(super) struct Binding {
    pub(super) queue: String,
    pub(super) key: String,
    pub(super) arguments: FieldTable,
}

pub(super) struct Exchange {
    pub(super) kind: Kind,
    pub(super) durable: bool,
    pub(super) auto_delete: bool,
    pub(super) internal: bool,
    /// It had a binding once (an auto-delete exchange goes when its last one goes).
    pub(super) bound: bool,
    pub(super) bindings: Vec<Binding>,
}

impl Exchange {
    /// The exchanges every RabbitMQ vhost has.
    pub(super) fn predeclared() -> HashMap<String, Exchange> {
        [
            ("amq.direct", Kind::Direct),
            ("amq.fanout", Kind::Fanout),
            ("amq.topic", Kind::Topic),
            ("amq.headers", Kind::Headers),
            ("amq.match", Kind::Headers),
        ]
        .into_iter()
        .map(|(name, kind)| {
            let x = Exchange {
                kind,
                durable: true,
                auto_delete: false,
                internal: false,
                bound: false,
                bindings: Vec::new(),
            };
            (name.to_string(), x)
        })
        .collect()
    }
}

/// A publish as the broker keeps it until it is routed.
pub(super) struct Outgoing {
    pub(super) exchange: String,
    pub(super) routing_key: String,
    pub(super) body: Vec<u8>,
    pub(super) properties: AmqpProperties,
    pub(super) mandatory: bool,
}

/// How a channel ends, as its consumers hear it.
#[derive(Clone)]
pub(super) enum End {
    /// The client closed the channel.
    Client,
    /// The broker closed it (a channel error).
    Server(super::reply::Refusal),
    /// The client closed the connection.
    ConnectionClosed,
    /// The connection was cut: receivers disconnect, nothing is said.
    Cut,
    /// The broker closed the connection (a connection error, e.g. 540 for `immediate`).
    ServerConnection(super::reply::Refusal),
}
