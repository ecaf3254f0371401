//! Passive checks, deletes and purges of queues and exchanges, and the health check's round
//! trip.

use crate::transport::QueueDeleteOptions;

use super::calls::map_err;
use super::spec::QueueInfo;
use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::Result;

impl Connection {
    /// The health check's round trip: a passive declare of `amq.direct` (every AMQP 0-9-1 vhost
    /// has it) on a short-lived channel. It needs no permission and changes nothing, so an
    /// application whose user may not configure queues is not reported down for it (Go's check
    /// declares a queue of its own, which needs the configure permission).
    pub(crate) fn round_trip(&self) -> Result<()> {
        self.with_channel(|c| {
            c.exchange_declare_passive("amq.direct")
                .map_err(|e| map_err("exchange", "amq.direct", "checking", e))
        })
    }

    /// Passive check of a queue: its counts, or [`Error::NotFound`](crate::Error::NotFound).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`](crate::Error::NotFound) when there is no such queue.
    pub fn queue_info(&self, name: &str) -> Result<QueueInfo> {
        check_name("queue", name, false)?;
        self.with_channel(|c| {
            let q = c
                .queue_declare_passive(name)
                .map_err(|e| map_err("queue", name, "checking", e))?;
            Ok(QueueInfo {
                name: q.name().to_string(),
                message_count: q.message_count(),
                consumer_count: q.consumer_count(),
            })
        })
    }

    /// Passive check of an exchange.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`](crate::Error::NotFound) when there is no such exchange.
    pub fn check_exchange(&self, name: &str) -> Result<()> {
        check_name("exchange", name, false)?;
        self.with_channel(|c| {
            c.exchange_declare_passive(name)
                .map(|_| ())
                .map_err(|e| map_err("exchange", name, "checking", e))
        })
    }

    /// Deletes a queue (and forgets it and its bindings); returns how many messages it held.
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn delete_queue(&self, name: &str) -> Result<u32> {
        check_name("queue", name, false)?;
        let n = self.with_channel(|c| {
            c.queue_delete(name, QueueDeleteOptions::default())
                .map_err(|e| map_err("queue", name, "deleting", e))
        })?;
        let mut t = self.shared.topology.lock();
        t.queues.retain(|q| q.name != name);
        t.bindings.retain(|b| b.queue != name);
        Ok(n)
    }

    /// Deletes an exchange (and forgets it and its bindings).
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn delete_exchange(&self, name: &str) -> Result<()> {
        check_name("exchange", name, false)?;
        self.with_channel(|c| {
            c.exchange_delete(name, false)
                .map_err(|e| map_err("exchange", name, "deleting", e))
        })?;
        let mut t = self.shared.topology.lock();
        t.exchanges.retain(|x| x.name != name);
        t.bindings.retain(|b| b.exchange != name);
        Ok(())
    }

    /// Purges a queue; returns how many messages were removed.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`](crate::Error::NotFound) when there is no such queue.
    pub fn purge_queue(&self, name: &str) -> Result<u32> {
        check_name("queue", name, false)?;
        self.with_channel(|c| {
            c.queue_purge(name)
                .map_err(|e| map_err("queue", name, "purging", e))
        })
    }
}
