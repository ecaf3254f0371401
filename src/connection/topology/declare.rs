//! Declaring exchanges and queues, binding and unbinding, each on a short-lived channel, and
//! remembering what was declared.

use crate::transport::Channel;

use super::calls::{bind_on, declare_exchange_on, declare_queue_on, map_err};
use super::remembered::upsert;
use super::spec::{to_table, Binding, ExchangeSpec, QueueInfo, QueueSpec};
use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::Result;

impl Connection {
    /// Runs `f` on a short-lived channel of its own.
    pub(super) fn with_channel<T>(&self, f: impl FnOnce(&Channel) -> Result<T>) -> Result<T> {
        let (channel, _link) = self.open_channel()?;
        let result = f(&channel);
        if result.is_ok() {
            // A channel the broker closed reports that again here: ignore it.
            let _ = channel.close();
        }
        result
    }

    /// Declares an exchange and remembers it for re-declaration after recovery.
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`](crate::Error::TopologyConflict) when it exists with other settings (the broker's reason
    /// names the argument; the connection keeps working); [`Error::ConnectionLost`](crate::Error::ConnectionLost) when the
    /// connection does not recover within the operation timeout.
    pub fn declare_exchange(&self, spec: &ExchangeSpec) -> Result<()> {
        check_name("exchange", &spec.name, false)?;
        self.with_channel(|c| declare_exchange_on(c, spec))?;
        let mut t = self.shared.topology.lock();
        upsert(&mut t.exchanges, spec.clone(), |x| x.name == spec.name);
        Ok(())
    }

    /// Declares a queue and remembers it for re-declaration after recovery (not a server-named
    /// one).
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`](crate::Error::TopologyConflict) naming the queue and, in the broker's reason, the argument,
    /// when it exists with other settings; the connection keeps working.
    pub fn declare_queue(&self, spec: &QueueSpec) -> Result<QueueInfo> {
        spec.validate()?;
        warn_if_transient_nonexclusive(spec);
        let info = self.with_channel(|c| declare_queue_on(c, spec))?;
        if !spec.name.is_empty() {
            let mut t = self.shared.topology.lock();
            upsert(&mut t.queues, spec.clone(), |x| x.name == spec.name);
        }
        Ok(info)
    }

    /// Binds a queue to an exchange and remembers the binding.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`](crate::Error::NotFound) when the queue or exchange does not exist.
    pub fn bind(&self, binding: &Binding) -> Result<()> {
        check_name("queue", &binding.queue, false)?;
        check_name("exchange", &binding.exchange, false)?;
        check_name("routing key", &binding.routing_key, true)?;
        self.with_channel(|c| bind_on(c, binding))?;
        let mut t = self.shared.topology.lock();
        upsert(&mut t.bindings, binding.clone(), |x| x == binding);
        Ok(())
    }

    /// Removes a binding (and forgets it).
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn unbind(&self, binding: &Binding) -> Result<()> {
        self.with_channel(|c| {
            c.queue_unbind(
                binding.queue.clone(),
                binding.exchange.clone(),
                binding.routing_key.clone(),
                to_table(&binding.arguments),
            )
            .map_err(|e| map_err("queue", &binding.queue, "unbinding", e))
        })?;
        self.shared
            .topology
            .lock()
            .bindings
            .retain(|x| x != binding);
        Ok(())
    }
}

/// RabbitMQ deprecates transient queues that are not exclusive (`transient_nonexcl_queues`: 4.0
/// logs it, 4.3 refuses them by default): said once per queue name in this process (bounded).
fn warn_if_transient_nonexclusive(spec: &QueueSpec) {
    static WARNED: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());
    if spec.durable || spec.exclusive || spec.name.is_empty() {
        return;
    }
    let mut warned = WARNED.lock();
    if warned.iter().any(|n| n == &spec.name) {
        return;
    }
    if warned.len() >= 256 {
        warned.clear();
    }
    warned.push(spec.name.clone());
    log::warn!(
        "acemq: queue {:?} is transient and not exclusive, which RabbitMQ deprecates \
         (transient_nonexcl_queues: 4.0 warns, 4.3 refuses it by default); make it exclusive \
         or durable",
        spec.name
    );
}
