//! The family's encrypted codec: AES-GCM around another codec's bytes.
//!
//! # The wire (byte for byte what Java, Python, Go, Ruby and .NET write)
//!
//! ```text
//! 0xAE  0x01  len  key id (len bytes, UTF-8)  12-byte nonce  ciphertext + 16-byte tag
//! ```
//!
//! - magic `0xAE`, version `0x01`, one length byte, the key identifier in the clear (1–255
//!   UTF-8 bytes, no NUL) — so a reader picks the key a message names, and key rotation works;
//! - a fresh 12-byte nonce per message from the operating system's random source;
//! - AES-GCM (key of 16, 24 or 32 bytes: AES-128/192/256) with a 16-byte tag, the
//!   **associated data being the header** (magic, version, length, identifier): a rewritten
//!   identifier makes the message fail to open;
//! - content type `application/vnd.acemq.encrypted` (never `+json`); the delegate's content
//!   type is not on the wire.
//!
//! (Python `codecs/encrypted.py` and its `tests/test_encrypted.py`, whose test vector — key
//! `2026-01` = bytes `00..1f`, nonce `00..0b`, plaintext `hello` — and body written by the Java
//! library are pinned in this crate's tests.)
//!
//! # Failures
//!
//! Decoding a body that is not this framing, one too short for a nonce and a tag, one naming a
//! key not on the keyring, or one that does not authenticate fails with a
//! [`FatalError`] inside [`Error::Codec`]: a consumer
//! dead-letters it at once (the same bytes never decrypt on a later attempt). A wrong key and a
//! tampered body give the **same** error text. No error, `Debug` output or log line contains a
//! key or a plaintext: keys print their identifier only.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use aes_gcm::aead::{Aead, OsRng, Payload};
use aes_gcm::aes::Aes192;
use aes_gcm::{AeadCore, Aes128Gcm, Aes256Gcm, AesGcm, KeyInit};
use base64::Engine as _;
use serde_json::Value;

use crate::codec::Codec;
use crate::error::FatalError;
use crate::error::{BoxError, Error, Result};

/// What the encrypted codec writes (and reads: a content type starting with it).
pub const ENCRYPTED_CONTENT_TYPE: &str = "application/vnd.acemq.encrypted";
/// The first byte of the framing.
pub const MAGIC: u8 = 0xAE;
/// The framing's version.
pub const VERSION: u8 = 0x01;
/// GCM's nonce length.
pub const NONCE_BYTES: usize = 12;
/// GCM's tag length.
pub const TAG_BYTES: usize = 16;
/// The longest key identifier, in UTF-8 bytes.
pub const MAX_KEY_ID_BYTES: usize = 255;

/// One AES key and the identifier messages name it by. `Debug` shows the identifier only.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey {
    id: String,
    key: Vec<u8>,
}

impl EncryptionKey {
    /// A key named `id` (1–255 UTF-8 bytes, no NUL) of 16, 24 or 32 bytes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty, too long or NUL-holding identifier or a key of
    /// another length (the message never shows the key).
    pub fn new(id: impl Into<String>, key: impl Into<Vec<u8>>) -> Result<EncryptionKey> {
        let id = id.into();
        let key = key.into();
        if id.is_empty() {
            return Err(Error::invalid(
                "a key identifier cannot be empty: it is what a reader looks the key up by",
            ));
        }
        if id.len() > MAX_KEY_ID_BYTES {
            return Err(Error::invalid(format!(
                "a key identifier is at most {MAX_KEY_ID_BYTES} bytes and this one is {}",
                id.len()
            )));
        }
        if id.contains('\0') {
            return Err(Error::invalid(format!(
                "the key identifier {id:?} contains a null byte"
            )));
        }
        check_key_size(key.len())?;
        Ok(EncryptionKey { id, key })
    }

    /// The identifier.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EncryptionKey(id={:?})", self.id)
    }
}

fn check_key_size(len: usize) -> Result<()> {
    if matches!(len, 16 | 24 | 32) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "an AES key is 16, 24 or 32 bytes and this one is {len}; a passphrase needs a key \
             derivation function (PBKDF2, scrypt, Argon2) first"
        )))
    }
}

/// A fresh 32-byte (AES-256) key from the operating system's random source.
pub fn generate_key() -> Vec<u8> {
    use aes_gcm::aead::rand_core::RngCore;
    let mut key = vec![0u8; 32];
    OsRng.fill_bytes(&mut key);
    key
}

/// Reads a key from Base64 (standard alphabet, padded; surrounding whitespace ignored), as keys
/// travel in configuration.
///
/// # Errors
///
/// [`Error::InvalidArgument`] when it is not Base64 or not 16, 24 or 32 bytes; the message
/// never quotes the input.
pub fn key_from_base64(encoded: &str) -> Result<Vec<u8>> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| Error::invalid("this is not Base64, so no key could be read from it"))?;
    check_key_size(key.len())?;
    Ok(key)
}

/// A key as Base64 (the inverse of [`key_from_base64`]); the result is the key itself.
pub fn key_to_base64(key: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// The keys a process reads with, and the one it writes with (the first added, unless
/// [`use_key`](Self::use_key) says otherwise). Rotate by adding the new key everywhere first,
/// then writing with it ([`use_key`](Self::use_key)). `Debug` shows identifiers only.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<EncryptionKey>,
    current: usize,
}

impl Keyring {
    /// A keyring holding one key.
    ///
    /// # Errors
    ///
    /// As [`EncryptionKey::new`].
    pub fn of(id: impl Into<String>, key: impl Into<Vec<u8>>) -> Result<Keyring> {
        Ok(Keyring::new(EncryptionKey::new(id, key)?))
    }

    /// A keyring writing with `key`.
    pub fn new(key: EncryptionKey) -> Keyring {
        Keyring {
            keys: vec![key],
            current: 0,
        }
    }

    /// Adds a key to read with (replacing one of the same identifier), without writing with it.
    pub fn with_key(mut self, key: EncryptionKey) -> Keyring {
        match self.keys.iter().position(|k| k.id == key.id) {
            Some(i) => self.keys[i] = key,
            None => self.keys.push(key),
        }
        self
    }

    /// Writes with the key `id` from now on.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the keyring does not hold it.
    pub fn use_key(mut self, id: &str) -> Result<Keyring> {
        self.current = self
            .keys
            .iter()
            .position(|k| k.id == id)
            .ok_or_else(|| Error::invalid(format!("there is no key {id:?} on this keyring")))?;
        Ok(self)
    }

    /// The key written with.
    pub fn current(&self) -> &EncryptionKey {
        &self.keys[self.current]
    }

    /// The identifiers held, in the order added.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    fn key_for(&self, id: &str) -> std::result::Result<&EncryptionKey, BoxError> {
        self.keys.iter().find(|k| k.id == id).ok_or_else(|| {
            fatal(format!(
                "acemq: this message was encrypted with key {id:?}, which is not on this keyring \
                 (it holds {}). Either the key was retired while messages written with it were \
                 still queued, or the message came from a service using a different keyring",
                self.ids().join(", ")
            ))
        })
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Keyring(current={:?}, holds={:?})",
            self.current().id,
            self.ids()
        )
    }
}

/// The header a message written with `key_id` starts with (and GCM authenticates): magic,
/// version, length, identifier.
pub fn frame(key_id: &str) -> Vec<u8> {
    let mut header = Vec::with_capacity(3 + key_id.len());
    header.extend_from_slice(&[MAGIC, VERSION, key_id.len().min(255) as u8]);
    header.extend_from_slice(key_id.as_bytes());
    header
}

/// The key identifier a body names, read without any key (for an operator looking at a
/// dead-letter queue); `None` when the body is not this framing.
pub fn key_id_of(body: &[u8]) -> Option<&str> {
    if body.len() < 3 || body[0] != MAGIC || body[1] != VERSION {
        return None;
    }
    let len = usize::from(body[2]);
    if len == 0 || body.len() < 3 + len {
        return None;
    }
    std::str::from_utf8(&body[3..3 + len]).ok()
}

fn fatal(text: String) -> BoxError {
    Box::new(FatalError::new(text))
}

fn seal(
    key: &EncryptionKey,
    nonce: &[u8],
    plaintext: &[u8],
) -> std::result::Result<Vec<u8>, BoxError> {
    let header = frame(&key.id);
    let payload = Payload {
        msg: plaintext,
        aad: &header,
    };
    let nonce = aes_gcm::Nonce::from_slice(nonce);
    let sealed = match key.key.len() {
        16 => Aes128Gcm::new_from_slice(&key.key).map(|c| c.encrypt(nonce, payload)),
        24 => AesGcm::<Aes192, aes_gcm::aead::consts::U12>::new_from_slice(&key.key)
            .map(|c| c.encrypt(nonce, payload)),
        _ => Aes256Gcm::new_from_slice(&key.key).map(|c| c.encrypt(nonce, payload)),
    };
    let sealed = match sealed {
        Ok(Ok(s)) => s,
        // Neither the key nor the plaintext goes into the message.
        _ => return Err(format!("acemq: could not encrypt with key {:?}", key.id).into()),
    };
    let mut body = header;
    body.reserve(NONCE_BYTES + sealed.len());
    body.extend_from_slice(nonce);
    body.extend_from_slice(&sealed);
    Ok(body)
}

fn open(keyring: &Keyring, body: &[u8]) -> std::result::Result<Vec<u8>, BoxError> {
    let Some(key_id) = key_id_of(body) else {
        return Err(fatal(
            "acemq: this message was not written by the encrypted codec: it does not start with \
             the framing that codec writes (a consumer configured to decrypt has been pointed at \
             a queue carrying something else)"
                .into(),
        ));
    };
    let header_len = 3 + key_id.len();
    if body.len() < header_len + NONCE_BYTES + TAG_BYTES {
        return Err(fatal(
            "acemq: this message is too short to hold a nonce and an authentication tag, so it \
             was truncated somewhere between being written and being read"
                .into(),
        ));
    }
    let key = keyring.key_for(key_id)?;
    let (header, rest) = body.split_at(header_len);
    let (nonce, sealed) = rest.split_at(NONCE_BYTES);
    let payload = Payload {
        msg: sealed,
        aad: header,
    };
    let nonce = aes_gcm::Nonce::from_slice(nonce);
    let opened = match key.key.len() {
        16 => Aes128Gcm::new_from_slice(&key.key).map(|c| c.decrypt(nonce, payload)),
        24 => AesGcm::<Aes192, aes_gcm::aead::consts::U12>::new_from_slice(&key.key)
            .map(|c| c.decrypt(nonce, payload)),
        _ => Aes256Gcm::new_from_slice(&key.key).map(|c| c.decrypt(nonce, payload)),
    };
    match opened {
        Ok(Ok(plain)) => Ok(plain),
        // One answer for a wrong key and a tampered body alike.
        _ => Err(fatal(format!(
            "acemq: this message did not decrypt with key {key_id:?}. Either that is not the \
             key it was written with, or it was altered after it was written"
        ))),
    }
}

/// Encrypts what another codec produced, and decrypts before handing the bytes back to it
/// (see the [module docs](self) for the wire format).
///
/// ```
/// use acemq_amqp::codecs::encrypted::{EncryptedCodec, Keyring, generate_key};
/// use acemq_amqp::{JsonCodec, Message};
///
/// # fn main() -> acemq_amqp::Result<()> {
/// let codec = EncryptedCodec::new(JsonCodec, Keyring::of("2026-01", generate_key())?);
/// let m = Message::encode(&codec, &serde_json::json!({"card": "4111"}))?;
/// assert_eq!(m.content_type.as_deref(), Some("application/vnd.acemq.encrypted"));
/// let back: serde_json::Value = m.decode(&codec)?;
/// assert_eq!(back["card"], "4111");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EncryptedCodec {
    delegate: Arc<dyn Codec>,
    keyring: Keyring,
}

impl EncryptedCodec {
    /// Encrypts `delegate`'s bytes with `keyring`'s current key.
    pub fn new(delegate: impl Codec + 'static, keyring: Keyring) -> EncryptedCodec {
        EncryptedCodec {
            delegate: Arc::new(delegate),
            keyring,
        }
    }

    /// The wrapped codec.
    pub fn delegate(&self) -> &Arc<dyn Codec> {
        &self.delegate
    }

    /// The keyring.
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Encrypts bytes with the current key and a fresh nonce.
    ///
    /// # Errors
    ///
    /// When the cipher refuses (it does not for keys this crate accepts).
    pub fn encrypt(&self, plaintext: &[u8]) -> std::result::Result<Vec<u8>, BoxError> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        seal(self.keyring.current(), &nonce, plaintext)
    }

    /// Decrypts a body written in the family's framing.
    ///
    /// # Errors
    ///
    /// A [`FatalError`] as described in the [module docs](self).
    pub fn decrypt(&self, body: &[u8]) -> std::result::Result<Vec<u8>, BoxError> {
        open(&self.keyring, body)
    }
}

impl fmt::Debug for EncryptedCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EncryptedCodec({:?}, key={:?})",
            self.delegate,
            self.keyring.current().id
        )
    }
}

impl Codec for EncryptedCodec {
    fn content_type(&self) -> &str {
        ENCRYPTED_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> std::result::Result<Vec<u8>, BoxError> {
        self.encrypt(&self.delegate.encode(value)?)
    }
    fn decode(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        let plain = self.decrypt(body)?;
        self.delegate
            .decode_typed(&plain, Some(self.delegate.content_type()))
    }
    /// Its own content type only, never a message with none: trying to decrypt plaintext
    /// would report the wrong problem.
    fn accepts(&self, content_type: Option<&str>) -> bool {
        super::accepts_listed(content_type, &[ENCRYPTED_CONTENT_TYPE], "\u{0}")
    }
    fn encodes_bytes(&self) -> bool {
        self.delegate.encodes_bytes()
    }
    fn encode_bytes(&self, bytes: Vec<u8>) -> std::result::Result<Vec<u8>, BoxError> {
        self.encrypt(&self.delegate.encode_bytes(bytes)?)
    }
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> std::result::Result<Cow<'a, [u8]>, BoxError> {
        let plain = self.decrypt(body)?;
        Ok(Cow::Owned(self.delegate.decode_bytes(&plain)?.into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_KEY: [u8; 32] = {
        let mut k = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            k[i] = i as u8;
            i += 1;
        }
        k
    };

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The family's vector (Python `tests/test_encrypted.py`, confirmed against the compiled
    /// Java codec): written here with the same key and nonce, byte for byte.
    #[test]
    fn writes_the_familys_vector_exactly() {
        let vector = hex(concat!(
            "ae0107323032362d3031",
            "000102030405060708090a0b",
            "2f67ba77aa632797b83b1f88ef1394bb9ff6e85641"
        ));
        let key = EncryptionKey::new("2026-01", TEST_KEY.to_vec()).unwrap();
        let nonce = hex("000102030405060708090a0b");
        assert_eq!(seal(&key, &nonce, b"hello").unwrap(), vector);
    }
}
