//! The transports beside AMQP, by the scheme of their address: the one table a new transport
//! adds a line to. `connection/address.rs` reads an address through it and
//! [`connect`](super::connect) opens one through it; AMQP (`amqp://`, `amqps://`) is the
//! default and is not listed.

use super::channel::Transport;
use super::feed::Feed;
use super::wire::Blocked;
use crate::error::BoxError;

/// A transport reached at `{name}://{host}`.
pub(crate) struct Scheme {
    /// The scheme, as in `memory`.
    pub(crate) name: &'static str,
    /// What this build needs for it, said when a feature left it out.
    pub(crate) needs: &'static str,
    /// Its functions, or `None` when a feature of this build left it out.
    pub(crate) ops: Option<Ops>,
}

/// A live connection and its blocked notices, as every transport opens one.
pub(crate) type Opened = (Box<dyn Transport>, Feed<Blocked>);

/// What a transport beside AMQP does.
#[derive(Clone, Copy)]
pub(crate) struct Ops {
    /// Checks the part after `{name}://`, which becomes the address's host, or says what is
    /// wrong with it.
    pub(crate) check: fn(&str) -> std::result::Result<(), String>,
    /// Connects to the broker the host names; the connection's name, for the broker's list.
    pub(crate) connect: fn(&str, Option<&str>) -> Result<Opened, BoxError>,
    /// How far that broker keeps its clock ahead of the system's, in ms.
    pub(crate) clock_offset_ms: fn(&str) -> i64,
}

/// Every transport beside AMQP.
pub(crate) const SCHEMES: &[Scheme] = &[Scheme {
    name: "memory",
    needs: "the in-process broker: build acemq-amqp with the `memory` feature (or `testing`, \
            which turns it on)",
    #[cfg(feature = "memory")]
    ops: Some(Ops {
        check: super::memory::check_name,
        connect: |name, connection| Ok(super::memory::connect(name, connection)?),
        clock_offset_ms: |name| super::memory::broker(name).clock_offset_ms(),
    }),
    #[cfg(not(feature = "memory"))]
    ops: None,
}];

/// The transport of scheme `name`, if one is listed.
pub(crate) fn find(name: &str) -> Option<&'static Scheme> {
    SCHEMES.iter().find(|s| s.name == name)
}

/// The functions of the transport of scheme `name`, if this build has it.
pub(crate) fn ops(name: &str) -> Option<Ops> {
    find(name).and_then(|s| s.ops)
}
