//! Claim checks: a large payload goes to a store and the message carries its key.
//!
//! [`ClaimCheckCodec`] wraps another codec (the *delegate*) and is itself a [`Codec`], so it is
//! set wherever a codec is (a connection, a publisher, a consumer). What it promises, exactly
//! (the family's framing, `tests/fixtures/claim_check.json`):
//!
//! * **Encoding.** The delegate encodes the payload. When those bytes are shorter than the
//!   threshold (default 64 KiB) the body is `AC 01 00` followed by exactly the delegate's
//!   bytes; at or above it (a threshold of 0 offloads everything) the delegate's bytes go to the
//!   [`ClaimCheckStore`] and the body is `AC 01 01` followed by the store's key as bare UTF-8.
//!   The content type stays the delegate's. No header is written (`x-acemq-claim` is the
//!   application's).
//! * **Decoding** decides from the body alone, never from a header: `AC 01 00` → the rest goes
//!   to the delegate; `AC 01 01` → the key is redeemed from the store and the payload goes to the
//!   delegate; anything else (too short, another version, another third byte, a body from a
//!   publisher without this codec) goes to the delegate **whole and untouched**, so the codec
//!   can be introduced on a live queue.
//! * **Failures.** A key the store no longer holds is a [`FatalError`]
//!   inside [`Error::Codec`]: a consumer dead-letters the message to `{queue}.dlq` (its store's
//!   retention must outlast every queue, dead-letter queue and replay). A store that *fails*
//!   (I/O) is an [`Error`] inside [`Error::Codec`]: the message is retried. A body that decodes
//!   but is not what the handler wanted is parked, as with any codec. A key the store
//!   *refuses* ([`Error::InvalidName`]: the filesystem store's key that could leave its root) is
//!   fatal like a missing one: refused on every attempt, it is dead-lettered at once with the
//!   store's reason.
//! * **The codec never deletes** a stored payload: a second consumer, a replay or a dead-letter
//!   queue may still need it. Deleting is a retention decision ([`ClaimCheckStore::delete`]).
//! * **Memory.** Over [`BytesCodec`](crate::BytesCodec) the codec has the bytes fast path (see
//!   [`Codec::encodes_bytes`]): a 16 MiB `Vec<u8>` is encoded and decoded without a
//!   `serde_json::Value`, peaking under 4× its size (measured by `tests/claim_check_memory.rs`).
//!
//! [`FilesystemClaimCheckStore`] keeps payloads as files under a root directory; its keys are
//! fresh random ids, and a key read from a message is checked before it touches the filesystem.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::codec::Codec;
use crate::error::FatalError;
use crate::error::{BoxError, Error, Result};

/// The first byte of a framed body.
const MAGIC: u8 = 0xAC;
/// The framing version this crate writes and reads.
const VERSION: u8 = 0x01;
/// The payload follows inline.
const INLINE: u8 = 0x00;
/// A store key follows.
const CLAIM: u8 = 0x01;
/// The default threshold: 64 KiB, as in every AceMQ library.
pub const DEFAULT_CLAIM_CHECK_THRESHOLD: usize = 64 * 1024;

/// Where claim-checked payloads are kept. Synchronous; shared by every thread that encodes or
/// decodes, so `Send + Sync`.
pub trait ClaimCheckStore: Send + Sync + fmt::Debug {
    /// Stores a payload and returns its key (non-empty UTF-8, unique for the store's life).
    ///
    /// # Errors
    ///
    /// Whatever kept it from being stored.
    fn put(&self, payload: &[u8]) -> Result<String>;

    /// The payload stored under `key`, or `None` when the store does not hold it.
    ///
    /// # Errors
    ///
    /// A failure to read (not a missing key: that is `Ok(None)`).
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Removes a payload; removing a missing key is not an error. Never called by the codec.
    ///
    /// # Errors
    ///
    /// A failure to remove.
    fn delete(&self, key: &str) -> Result<()>;
}

/// True when `body` carries a claim check (`AC 01 01` + key) rather than a payload.
pub fn is_claim_check(body: &[u8]) -> bool {
    framed(body) == Some(CLAIM)
}

/// The store key a claim-checked body refers to, without fetching it; `None` for a body that
/// is inline, not written by this codec, or whose key is not UTF-8.
pub fn claim_key_of(body: &[u8]) -> Option<&str> {
    if is_claim_check(body) {
        std::str::from_utf8(&body[3..]).ok()
    } else {
        None
    }
}

/// The third byte of a body framed by this codec, or `None` for any other body.
fn framed(body: &[u8]) -> Option<u8> {
    match body {
        [MAGIC, VERSION, kind @ (INLINE | CLAIM), ..] => Some(*kind),
        _ => None,
    }
}

fn frame(kind: u8, rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(3 + rest.len());
    body.extend_from_slice(&[MAGIC, VERSION, kind]);
    body.extend_from_slice(rest);
    body
}

/// A [`Codec`] that puts payloads at or above a threshold in a [`ClaimCheckStore`] and sends
/// the key instead (see the [module docs](self) for the exact framing and failures).
///
/// ```no_run
/// use acemq_amqp::patterns::claim_check::{ClaimCheckCodec, FilesystemClaimCheckStore};
/// use acemq_amqp::{BytesCodec, Connection, ConnectionOptions};
/// # fn main() -> acemq_amqp::Result<()> {
/// let store = FilesystemClaimCheckStore::new("/var/lib/claims")?;
/// let codec = ClaimCheckCodec::new(BytesCodec, store).threshold(256 * 1024);
/// let connection = acemq_amqp::Connection::open_with(ConnectionOptions::new().codec(codec))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClaimCheckCodec {
    delegate: Arc<dyn Codec>,
    store: Arc<dyn ClaimCheckStore>,
    threshold: usize,
}

impl fmt::Debug for ClaimCheckCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimCheckCodec")
            .field("delegate", &self.delegate)
            .field("store", &self.store)
            .field("threshold", &self.threshold)
            .finish()
    }
}

impl ClaimCheckCodec {
    /// Wraps `delegate`, offloading to `store` at the default threshold (64 KiB).
    pub fn new(delegate: impl Codec + 'static, store: impl ClaimCheckStore + 'static) -> Self {
        ClaimCheckCodec::with_shared(Arc::new(delegate), Arc::new(store))
    }

    /// As [`new`](Self::new), with a delegate and a store already shared.
    pub fn with_shared(delegate: Arc<dyn Codec>, store: Arc<dyn ClaimCheckStore>) -> Self {
        ClaimCheckCodec {
            delegate,
            store,
            threshold: DEFAULT_CLAIM_CHECK_THRESHOLD,
        }
    }

    /// Encoded payloads of at least `bytes` go to the store; 0 offloads everything. Defaults to
    /// 64 KiB ([`DEFAULT_CLAIM_CHECK_THRESHOLD`]).
    pub fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// The threshold in bytes.
    pub fn threshold_bytes(&self) -> usize {
        self.threshold
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ClaimCheckStore> {
        &self.store
    }

    /// Frames what the delegate encoded: inline under the threshold, else stored.
    fn wrap(&self, encoded: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        if encoded.len() < self.threshold {
            return Ok(frame(INLINE, &encoded));
        }
        let key = self.store.put(&encoded)?;
        if key.is_empty() {
            return Err(Box::new(FatalError::new(
                "the claim-check store returned an empty key, which no message could redeem",
            )));
        }
        Ok(frame(CLAIM, key.as_bytes()))
    }

    /// What the delegate should read: the body itself, the inline part, or the stored payload.
    fn unwrap<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        match framed(body) {
            None => Ok(Cow::Borrowed(body)),
            Some(INLINE) => Ok(Cow::Borrowed(&body[3..])),
            Some(_) => {
                let key = std::str::from_utf8(&body[3..]).map_err(|_| {
                    FatalError::new("a claim-check body carries a key that is not UTF-8")
                })?;
                let held = match self.store.get(key) {
                    Ok(held) => held,
                    // A key the store refuses (one that could leave its root, say) is refused
                    // on every attempt: the message can never be read.
                    Err(refused @ Error::InvalidName { .. }) => {
                        return Err(Box::new(FatalError::new(format!(
                            "the claim check {key:?} cannot be redeemed: {refused}"
                        ))));
                    }
                    Err(e) => return Err(Box::new(e)),
                };
                match held {
                    Some(payload) => Ok(Cow::Owned(payload)),
                    None => Err(Box::new(FatalError::new(format!(
                        "the claim check {key:?} is not in the store, so this message cannot be \
                         read: the payload was removed while a message referring to it was still \
                         deliverable (the store's retention must outlast every queue, dead-letter \
                         queue and replay)"
                    )))),
                }
            }
        }
    }
}

impl Codec for ClaimCheckCodec {
    fn content_type(&self) -> &str {
        self.delegate.content_type()
    }

    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        let encoded = self.delegate.encode(value)?;
        self.wrap(encoded)
    }

    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        let payload = self.unwrap(body)?;
        self.delegate.decode(&payload)
    }

    fn encodes_bytes(&self) -> bool {
        self.delegate.encodes_bytes()
    }

    fn encode_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        let encoded = self.delegate.encode_bytes(bytes)?;
        self.wrap(encoded)
    }

    fn decode_bytes<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        match self.unwrap(body)? {
            Cow::Borrowed(b) => self.delegate.decode_bytes(b),
            Cow::Owned(fetched) => {
                let decoded = self.delegate.decode_bytes(&fetched)?;
                // The delegate handed the fetched payload back whole: keep it, no copy.
                if let Cow::Borrowed(b) = &decoded {
                    if b.as_ptr() == fetched.as_ptr() && b.len() == fetched.len() {
                        return Ok(Cow::Owned(fetched));
                    }
                }
                Ok(Cow::Owned(decoded.into_owned()))
            }
        }
    }
}

/// A [`ClaimCheckStore`] keeping each payload as a file under a root directory.
///
/// Keys it issues are fresh random ids. A key read from a message is checked before it touches
/// the filesystem: an empty key, an absolute one, one with a NUL or a backslash, or one with a
/// `..`, `.` or empty path segment is refused with [`Error::InvalidName`], so no key reaches
/// outside the root. `/` separates directories (`orders/2026/abcd` is a file in
/// `orders/2026/`). Writes are atomic: a temporary file beside the target, written, `fsync`ed
/// and renamed over it (then the directory is `fsync`ed), so a reader never sees half a
/// payload. On Unix each payload's file is created readable and writable by its owner only
/// (0600), as the family's stores write them: the root is often a shared mount.
#[derive(Clone, Debug)]
pub struct FilesystemClaimCheckStore {
    root: PathBuf,
}

impl FilesystemClaimCheckStore {
    /// A store under `root`, created if missing.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the directory cannot be created.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| io("creating the claim-check root", e))?;
        Ok(FilesystemClaimCheckStore { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file for `key`, or [`Error::InvalidName`] when the key could leave the root.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] naming why the key is refused.
    pub fn path_of(&self, key: &str) -> Result<PathBuf> {
        let refuse = |reason: &str| Error::InvalidName {
            kind: "claim-check key",
            name: key.chars().take(100).collect(),
            reason: reason.to_string(),
        };
        if key.is_empty() {
            return Err(refuse("it is empty"));
        }
        if key.contains('\0') {
            return Err(refuse("it contains a NUL byte"));
        }
        if key.contains('\\') {
            return Err(refuse("it contains a backslash"));
        }
        if key.starts_with('/') || Path::new(key).is_absolute() {
            return Err(refuse("it is an absolute path"));
        }
        if key
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(refuse(
                "it has an empty, `.` or `..` segment, which could leave the store's root",
            ));
        }
        let relative = Path::new(key);
        if !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(refuse("it is not a plain relative path"));
        }
        Ok(self.root.join(relative))
    }
}

/// A new file readable and writable by its owner only (0600 on Unix), as the family's stores
/// write payloads: a claim-check root is often a shared mount.
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

fn io(context: &str, e: std::io::Error) -> Error {
    Error::Io {
        context: context.to_string(),
        source: e,
    }
}

impl ClaimCheckStore for FilesystemClaimCheckStore {
    fn put(&self, payload: &[u8]) -> Result<String> {
        let key = crate::new_id();
        let path = self.path_of(&key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let tmp = dir.join(format!(".{key}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut file = create_private(&tmp)?;
            file.write_all(payload)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The rename itself is durable once the directory is.
            if let Ok(d) = std::fs::File::open(&dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&format!("writing claim check {key:?}"), e));
        }
        Ok(key)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path_of(key)?;
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&format!("reading claim check {key:?}"), e)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path_of(key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&format!("deleting claim check {key:?}"), e)),
        }
    }
}
