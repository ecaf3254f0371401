//! [`Capabilities`]: what a transport can do, as the family's `/acemq-info` lists it (Go's
//! `transport` object of `Capability` strings).

/// What the transport behind a [`Connection`](crate::Connection) can do, as the family lists it
/// on `/acemq-info` (`transport`: `publisher-confirms`, `dead-lettering`, `quorum-queues`,
/// `streams`, `recovery`). From [`Connection::capabilities`](crate::Connection::capabilities).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The broker confirms each publish (`confirm.select`).
    pub publisher_confirms: bool,
    /// The broker dead-letters through a queue's dead-letter exchange.
    pub dead_lettering: bool,
    /// Quorum queues can be declared.
    pub quorum_queues: bool,
    /// Streams can be declared and read.
    pub streams: bool,
    /// A lost connection is made again, its topology re-declared (this library's connection
    /// does it over either transport).
    pub recovery: bool,
}

impl Capabilities {
    /// Everything (RabbitMQ).
    pub(crate) const ALL: Capabilities = Capabilities {
        publisher_confirms: true,
        dead_lettering: true,
        quorum_queues: true,
        streams: true,
        recovery: true,
    };

    /// The family's names and values, in the family's order: `(name, supported)`.
    pub fn entries(&self) -> [(&'static str, bool); 5] {
        [
            ("publisher-confirms", self.publisher_confirms),
            ("dead-lettering", self.dead_lettering),
            ("quorum-queues", self.quorum_queues),
            ("streams", self.streams),
            ("recovery", self.recovery),
        ]
    }
}
