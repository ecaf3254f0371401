//! Connecting to the first of the configured addresses that answers; each connection is made by
//! the transport its address names (`crate::transport::connect`).

use super::address::Address;
use super::options::ConnectionOptions;
use crate::error::{Error, Result};
use crate::transport::{Blocked, Feed, Transport};

/// Tries each address once, in order.
pub(super) fn connect_any(
    options: &ConnectionOptions,
    addresses: &[Address],
) -> Result<(Box<dyn Transport>, Feed<Blocked>, Address)> {
    let mut last = None;
    for address in addresses {
        match connect_one(options, address) {
            Ok((c, b)) => return Ok((c, b, address.clone())),
            Err(e) => {
                log::debug!("acemq: connecting to {address} failed: {e}");
                last = Some((address, e));
            }
        }
    }
    match last {
        Some((address, source)) => Err(Error::Connect {
            address: address.to_string(),
            source,
        }),
        None => Err(Error::invalid("no broker address given")),
    }
}

fn connect_one(
    options: &ConnectionOptions,
    address: &Address,
) -> std::result::Result<(Box<dyn Transport>, Feed<Blocked>), crate::error::BoxError> {
    crate::transport::connect(options, address)
}
