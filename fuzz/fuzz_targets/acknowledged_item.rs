//! The acknowledged consumer's item decoding: a counter increment from an arbitrary payload
//! (an error or an increment, never a panic; an increment writes back to a payload that reads
//! the same), and the codecs a consumer decodes bodies with.
#![no_main]

use acemq_amqp::patterns::acknowledged::CounterIncrement;
use acemq_amqp::{BytesCodec, Codec, JsonCodec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(item) = CounterIncrement::from_payload(data) {
        let again = CounterIncrement::from_payload(&item.payload()).expect("reads back");
        assert_eq!(again, item);
        let _ = item.message("fuzz");
    }
    if let Ok(v) = JsonCodec.decode(data) {
        let bytes = JsonCodec.encode(&v).expect("a decoded value encodes");
        assert_eq!(JsonCodec.decode(&bytes).expect("and decodes"), v);
    }
    let _ = BytesCodec.decode(data);
    assert_eq!(&*BytesCodec.decode_bytes(data).expect("bytes are bytes"), data);
});
