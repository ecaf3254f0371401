//! The family's optional codecs, each behind its own feature, and reading by content type.
//!
//! [`JsonCodec`](crate::JsonCodec) and [`BytesCodec`](crate::BytesCodec) need nothing; the
//! formats below are the ones the Java and Go libraries ship as optional modules, so a message
//! another service wrote in one of them is readable here.
//!
//! | module | feature | writes |
//! |---|---|---|
//! | [`encrypted`] | `encryption` | `application/vnd.acemq.encrypted` (AES-GCM around another codec) |

#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub mod encrypted;
