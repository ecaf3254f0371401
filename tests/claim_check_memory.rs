//! The memory a 16 MiB payload costs through `ClaimCheckCodec` over `BytesCodec`, measured by
//! a counting global allocator (this test binary's own): encode (stored as a file), then decode
//! back into a `Vec<u8>`, must peak under 4× the payload (the payload itself included). Before
//! the bytes fast path, `BytesCodec` went through `serde_json::Value` (a JSON number per byte:
//! hundreds of MiB).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use acemq_amqp::patterns::claim_check::{
    is_claim_check, ClaimCheckCodec, FilesystemClaimCheckStore,
};
use acemq_amqp::{BytesCodec, Message};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(live, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::SeqCst) + new_size
                    - layout.size();
                PEAK.fetch_max(live, Ordering::SeqCst);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SIZE: usize = 16 * 1024 * 1024;

#[test]
fn a_16_mib_payload_through_claim_check_over_bytes_peaks_under_4x() {
    let dir = tempfile::tempdir().unwrap();
    let codec = ClaimCheckCodec::new(
        BytesCodec,
        FilesystemClaimCheckStore::new(dir.path()).unwrap(),
    );
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);

    let payload: Vec<u8> = (0..SIZE).map(|i| (i % 253) as u8).collect();
    let message = Message::encode(&codec, &payload).unwrap();
    assert!(is_claim_check(&message.body));
    let encode_peak = PEAK.load(Ordering::SeqCst) - base;

    let decoded: Vec<u8> = message.decode(&codec).unwrap();
    assert!(decoded == payload);
    let peak = PEAK.load(Ordering::SeqCst) - base;
    drop(decoded);
    drop(payload);

    let ratio = peak as f64 / SIZE as f64;
    println!(
        "16 MiB through ClaimCheckCodec<BytesCodec>: encode peak {:.2}x, encode+decode peak \
         {ratio:.2}x the payload (payload included)",
        encode_peak as f64 / SIZE as f64
    );
    assert!(
        ratio < 4.0,
        "peaked at {ratio:.2}x the payload ({peak} bytes)"
    );
}
