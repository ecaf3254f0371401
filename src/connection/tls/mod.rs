//! TLS for `amqps://` addresses (feature `tls`), as the family does it (Python `security.py`, Go
//! `security`): a given authority trusted alone, a client certificate, a server-name override, a
//! TLS 1.2 floor, settings refused on a plain address, and certificates carrying the family's
//! development marker refused unless allowed.
//!
//! The handshake is made here, not by amiquip (`stream`): amiquip's `open_tls_stream` keeps the
//! TLS stream to itself, so the broker's certificate could not be read before the AMQP
//! handshake. A failed handshake is named (`failure`).

mod failure;
mod settings;
mod stream;

pub use failure::{TlsError, TlsFailure};
pub(crate) use settings::{Pem, TlsSettings};
pub(crate) use stream::{client_certificate_refusal, handshake, TlsIo};
